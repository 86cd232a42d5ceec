"""One command puts the gateway in front of any OpenAI-compatible server."""

from __future__ import annotations

import re
import signal
import subprocess

import openai

from ops.processes import PYTHON, REPO_ROOT, free_port, wait_until


def test_the_standalone_gateway_serves_a_minted_key_in_front_of_an_upstream(
    start_simulator, tmp_path
) -> None:
    """It serves the SDK with the key it printed, and Ctrl-C stops it and its children, even
    when it was started with SIGINT ignored."""
    upstream = start_simulator("llama-existing", "--time-scale", "0")
    port = free_port()
    out = tmp_path / "out.txt"
    with out.open("w") as sink:
        process = subprocess.Popen(
            [PYTHON, "-m", "ops.standalone", "--upstream", upstream.base_url,
             "--model", "llama", "--served-name", "llama-existing", "--port", str(port)],
            cwd=REPO_ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
            # Started as a shell starts a background job: SIGINT ignored, which it inherits.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )  # fmt: skip
    try:
        assert wait_until(
            lambda: "API key:" in out.read_text() or process.poll() is not None, timeout=60
        )
        key = re.search(r"API key: (sk-sy-\S+)", out.read_text()).group(1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)
        assert [m.id for m in client.models.list()] == ["llama"]
        reply = client.chat.completions.create(
            model="llama", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert reply.choices[0].message.content
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0, out.read_text()
