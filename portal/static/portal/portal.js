// Copy buttons: <button data-copy="ID"> copies the text of element ID and says so aloud.
document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-copy]");
  if (!button) return;
  const source = document.getElementById(button.dataset.copy);
  const status = document.getElementById(button.dataset.copyStatus || "");
  const say = (text) => { if (status) status.textContent = text; };
  try {
    await navigator.clipboard.writeText(source.textContent.trim());
    say("Copied to the clipboard.");
  } catch (error) {
    const range = document.createRange();
    range.selectNodeContents(source);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    say("Selected: press Ctrl+C (⌘C on a Mac) to copy.");
  }
});

// Confirm dangerous buttons: <button data-confirm="Really?">.
document.addEventListener("submit", (event) => {
  const button = event.submitter;
  if (button && button.dataset.confirm && !window.confirm(button.dataset.confirm)) {
    event.preventDefault();
  }
});

// Live regions: <div data-poll="URL" data-poll-ms="2000"> is replaced by the partial at URL
// every few seconds until the partial says it is final (data-final="true"). A change of
// state is said aloud once through #file-progress-announce; the percentage is not (the
// progress bar itself carries it).
(() => {
  const live = document.querySelector("[data-poll]");
  if (!live) return;
  const every = Number(live.dataset.pollMs) || 2000;
  const announce = document.getElementById("file-progress-announce");
  let lastState = live.querySelector("[data-state]")?.dataset.state;
  const tick = async () => {
    let stop = false;
    try {
      const response = await fetch(live.dataset.poll, { credentials: "same-origin", headers: { Accept: "text/html" } });
      if (response.ok) {
        live.innerHTML = await response.text();
        const current = live.querySelector("[data-state]");
        if (current && current.dataset.state !== lastState) {
          lastState = current.dataset.state;
          if (announce) announce.textContent = `State: ${current.querySelector(".status")?.textContent || lastState}.`;
        }
        stop = current?.dataset.final === "true";
      } else if (response.status === 404 || response.status === 403) {
        stop = true;
      }
    } catch (error) {
      // A blip in the network: try again at the next tick.
    }
    if (stop) {
      live.removeAttribute("data-poll");
      // What only makes sense while the file runs (the cancel form) goes with it.
      document.querySelectorAll("[data-hide-when-final]").forEach((element) => { element.hidden = true; });
    }
    else setTimeout(tick, every);
  };
  setTimeout(tick, every);
})();
