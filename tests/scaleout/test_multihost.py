"""The stack across four hosts (network namespaces, testkit/netns.py): Valkey on A, a
gateway (with its fleet watcher) on B whose wall clock is 90 s ahead, a simulator on C, a
client on D. The client gets a completion; the gateway's host is then cut off from Valkey:
it fails closed (a 503, never a forwarded request nor a hang) and, past its policy staleness
bound, refuses every key (``policy_stale``); healed, it serves again."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import valkey

from ops.processes import PYTHON, fleet_is_written, gateway_command, http_ready, wait_until
from testkit.netns import Host, skewed
from testkit.policy import PolicyBuilder
from testkit.valkey_ha import VALKEY_SERVER
from tests.scaleout.conftest import NetworkFactory

CHAT = "llama-hosts"
STALENESS_S = 3

# Runs in host D: one chat completion, printed as {"status": …, "code": …, "content": …}.
CLIENT = """
import json, sys, urllib.request, urllib.error
url, key = sys.argv[1], sys.argv[2]
body = json.dumps({"model": sys.argv[3], "messages": [{"role": "user", "content": "hi"}]})
request = urllib.request.Request(url, body.encode(), {"Authorization": "Bearer " + key,
                                                      "Content-Type": "application/json"})
try:
    with urllib.request.urlopen(request, timeout=20) as response:
        answer = json.load(response)
        print(json.dumps({"status": response.status, "code": "",
                          "content": answer["choices"][0]["message"]["content"]}))
except urllib.error.HTTPError as error:
    print(json.dumps({"status": error.code, "code": json.load(error)["error"]["code"]}))
"""


def chat(client: Host, gateway_url: str, key: str) -> dict[str, object]:
    done = client.run([PYTHON, "-c", CLIENT, gateway_url + "/v1/chat/completions", key, CHAT])
    assert done.returncode == 0, done.stderr
    answer: dict[str, object] = json.loads(done.stdout)
    return answer


def test_a_gateway_cut_off_from_valkey_fails_closed_and_recovers(
    hosts: NetworkFactory, tmp_path: Path
) -> None:
    network = hosts(["valkey", "gateway", "simulator", "client"])
    valkey_host, gateway_host = network["valkey"], network["gateway"]
    simulator_host, client_host = network["simulator"], network["client"]

    store = valkey_host.process(
        "valkey",
        [VALKEY_SERVER, "--bind", valkey_host.address, "--port", "6379", "--save", "",
         "--appendonly", "no", "--protected-mode", "no", "--dir", str(tmp_path)],
        log_dir=tmp_path,
    )  # fmt: skip
    store.start(ready=lambda: _pings(valkey_host.address), timeout=10)
    sim_url = f"http://{simulator_host.address}:8000"
    simulator_host.process(
        "simulator",
        [PYTHON, "-m", "simulator", "--host", simulator_host.address, "--port", "8000",
         "--served-model-name", CHAT, "--time-scale", "0"],
        log_dir=tmp_path,
    ).start(ready=http_ready(sim_url + "/health"), timeout=20)  # fmt: skip

    client = valkey.Valkey(host=valkey_host.address, port=6379)
    policy = PolicyBuilder().model(CHAT, [sim_url])
    key = policy.key()
    policy.publish(client)
    env = {
        "SWITCHYARD_VALKEY_URL": f"valkey://{valkey_host.address}:6379/0",
        "SWITCHYARD_GATEWAY_POLICY_REFRESH_SECONDS": "0.1",
        "SWITCHYARD_GATEWAY_POLICY_MAX_STALENESS_SECONDS": str(STALENESS_S),
        "SWITCHYARD_FLEET_SCRAPE_INTERVAL_SECONDS": "0.1",
    }
    gateway_host.process(
        "fleet-watcher", [PYTHON, "-m", "gateway.fleet_watcher"], env=env, log_dir=tmp_path
    ).start(ready=fleet_is_written(client), timeout=20)
    # The gateway's wall clock is 90 s ahead of Valkey's: admission reads Valkey's clock
    # (gateway/scheduling/clock.py), so the skew must change nothing.
    gateway_url = f"http://{gateway_host.address}:8080"
    gateway = gateway_host.process(
        "gateway",
        skewed(gateway_command(gateway_host.address, 8080), offset_s=90),
        env=env,
        log_dir=tmp_path,
    )
    gateway.start(ready=http_ready(gateway_url + "/healthz", expect=200), timeout=30)

    # GIVEN a client on its own host gets a completion through the gateway
    first = chat(client_host, gateway_url, key)
    assert first["status"] == 200, first
    assert first["content"], first

    # WHEN the gateway's host is cut off from Valkey's (the client still reaches it)
    gateway_host.partition(valkey_host)
    # THEN it fails closed: every answer is a 503 that says why, and once its policy is
    # older than the staleness bound no key is honoured at all
    seen: list[dict[str, object]] = []

    def refuses_stale() -> bool:
        seen.append(chat(client_host, gateway_url, key))
        return seen[-1]["code"] == "policy_stale"

    assert wait_until(refuses_stale, timeout=STALENESS_S + 20, interval=0.2), seen
    assert {(a["status"], a["code"]) for a in seen} <= {
        (503, "admission_unavailable"),
        (503, "policy_stale"),
    }, seen
    assert gateway.alive()

    # AND once healed it serves again
    gateway_host.heal()
    assert wait_until(lambda: chat(client_host, gateway_url, key)["status"] == 200, timeout=30)


def _pings(host: str) -> bool:
    try:
        return bool(valkey.Valkey(host=host, port=6379, socket_timeout=0.5).ping())
    except (valkey.ValkeyError, OSError):
        return False


def test_a_crashed_runs_namespaces_are_removed_before_a_new_network(
    hosts: NetworkFactory,
) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # a run's process id that no longer exists
    stale = f"syha{gone.pid}-switch"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    try:
        network = hosts(["only"])
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert stale not in names
        assert network["only"].namespace in names
    finally:
        subprocess.run(["ip", "netns", "delete", stale], capture_output=True)
