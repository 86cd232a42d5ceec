"""One checkout's detectors on labelled sets, as JSON on stdout: the measuring half of
bench/guardrails/quality.py, run as a child process with ``PYTHONPATH`` set to the checkout
being measured (this one, or a baseline's), so both are measured by the same code under the
same load.

    python bench/guardrails/quality_probe.py NAME=PROMPTS:SETTINGS [...]

It imports only what every checkout since the labelled sets began has (``Engine``,
``evaluate``, ``load_prompts``, ``load_settings``), so an older commit can be measured on the
current sets.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any


def _rss_mib() -> tuple[float, float]:
    status = Path("/proc/self/status").read_text()
    found = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.MULTILINE))
    return int(found["VmRSS"]) / 1024, int(found["VmHWM"]) / 1024


def main(argv: list[str]) -> None:
    from guardrails.engine import Engine
    from testkit.guardrail_quality import evaluate, load_prompts, load_settings

    started = time.perf_counter()
    engine = Engine()
    load_s = time.perf_counter() - started
    sets: dict[str, Any] = {}
    for arg in argv:
        name, _, paths = arg.partition("=")
        prompts, _, settings = paths.partition(":")
        run = evaluate(engine, load_prompts(Path(prompts)), load_settings(engine, Path(settings)))
        sets[name] = {
            guardrail: {
                "tp": score.tp,
                "fp": score.fp,
                "fn": score.fn,
                "false_alarms": score.false_alarms,
                "misses": score.misses,
                "latencies": run.latencies[guardrail],
            }
            for guardrail, score in run.scores.items()
        }
    rss = _rss_mib()
    json.dump({"load_s": load_s, "rss_mib": rss, "sets": sets}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
