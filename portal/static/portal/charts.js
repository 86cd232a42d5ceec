// Usage charts: each <canvas data-chart="ID"> is drawn from the JSON in <script id="ID">
// (written by Django's json_script; the CSP allows no inline script). Tooltips show every
// series' number for the period under the pointer; an amount of money (spec.currency) is
// quoted as the table writes it (spec.datasets[].display), from the exact decimal the server
// computed. Charts swapped in by htmx (the time range links) are drawn as they arrive.
(function () {
  "use strict";

  function draw(canvas) {
    if (canvas.dataset.drawn) return;
    const source = document.getElementById(canvas.dataset.chart);
    if (!source || typeof window.Chart === "undefined") return;
    const spec = JSON.parse(source.textContent);
    const line = spec.type === "line";
    const money = Boolean(spec.currency);
    canvas.dataset.drawn = "true";
    new window.Chart(canvas, {
      type: spec.type,
      data: {
        labels: spec.labels,
        datasets: spec.datasets.map((d) => ({
          label: d.label,
          data: money ? d.data.map((v) => (v === null ? null : Number(v))) : d.data,
          display: d.display,
          backgroundColor: d.color,
          borderColor: d.color,
          borderWidth: line ? 2 : 0,
          pointRadius: line ? 2 : 0,
          tension: 0,
        })),
      },
      options: {
        responsive: true,
        maintainAspectRatio: false,
        animation: false,
        interaction: { mode: "index", intersect: false },
        scales: {
          x: { stacked: spec.stacked, ticks: { color: "#333", maxRotation: 0, autoSkip: true, autoSkipPadding: 16 } },
          y: {
            stacked: spec.stacked,
            beginAtZero: true,
            ticks: money ? { color: "#333" } : { color: "#333", precision: 0 },
            title: { display: true, text: spec.unit, color: "#333" },
          },
        },
        plugins: {
          legend: { labels: { color: "#222" } },
          tooltip: {
            callbacks: {
              label: (item) =>
                money
                  ? `${item.dataset.label}: ${item.dataset.display[item.dataIndex]} ${spec.currency}`
                  : `${item.dataset.label}: ${item.parsed.y.toLocaleString("en")} ${spec.unit}`,
            },
          },
        },
      },
    });
  }

  function drawAll(root) {
    (root || document).querySelectorAll("canvas[data-chart]").forEach(draw);
  }

  document.addEventListener("DOMContentLoaded", () => drawAll(document));
  // Charts about to be replaced let go of their canvas (Chart.js keeps a registry of them).
  document.addEventListener("htmx:beforeSwap", (event) => {
    event.detail.target.querySelectorAll("canvas[data-chart]").forEach((canvas) => {
      const chart = window.Chart && window.Chart.getChart(canvas);
      if (chart) chart.destroy();
    });
  });
  document.addEventListener("htmx:afterSettle", () => drawAll(document));
})();
