"""The simulator's configuration: one frozen dataclass, built from argv or in code.

Defaults resemble Llama-3.1-8B served in bf16 on one H100 80GB, so a simulator started
without options behaves like the replica the gateway meets most often in production.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

ModelKind = Literal["chat", "guard", "embedding", "transcription"]
SchedulingPolicy = Literal["fcfs", "priority"]


@dataclass(frozen=True, slots=True)
class FaultSettings:
    """Which misbehaviours to inject; all off by default. Changeable at runtime."""

    error_rate: float = 0.0
    hang_rate: float = 0.0
    slow_first_byte_ms: float = 0.0
    die_mid_stream_rate: float = 0.0
    die_after_requests: int | None = None

    def __post_init__(self) -> None:
        for name in ("error_rate", "hang_rate", "die_mid_stream_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, got {value}")
        if self.slow_first_byte_ms < 0:
            raise ValueError(f"slow_first_byte_ms must be >= 0, got {self.slow_first_byte_ms}")
        if self.die_after_requests is not None and self.die_after_requests < 1:
            raise ValueError(f"die_after_requests must be >= 1, got {self.die_after_requests}")


@dataclass(frozen=True, slots=True)
class SimulatorConfig:
    served_model_names: tuple[str, ...] = ("sim-chat",)
    model: str | None = None  # the "path" vLLM was started with; shown as `root` in /v1/models
    host: str = "127.0.0.1"
    port: int = 8000
    kind: ModelKind = "chat"
    max_model_len: int = 8192
    max_num_seqs: int = 256
    # vLLM V1's chunked prefill and its step token budget for `vllm serve` on a GPU of 70 GiB
    # or more that is not an A100 (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults).
    enable_chunked_prefill: bool = True
    max_num_batched_tokens: int = 8192
    kv_cache_tokens: int = 400_000
    block_size: int = 16
    prefill_tokens_per_s: float = 20_000.0
    decode_step_ms: float = 8.0
    decode_step_ms_per_seq: float = 0.06
    time_scale: float = 1.0
    scheduling_policy: SchedulingPolicy = "fcfs"
    embedding_dim: int = 384
    matryoshka: bool = True  # whether embeddings accept `dimensions`
    seed: int = 0
    faults: FaultSettings = field(default_factory=FaultSettings)

    def __post_init__(self) -> None:
        if not self.served_model_names or not all(self.served_model_names):
            raise ValueError("at least one non-empty served model name is required")
        if self.kind not in get_args(ModelKind):
            raise ValueError(f"unknown kind {self.kind!r}")
        if self.scheduling_policy not in get_args(SchedulingPolicy):
            raise ValueError(f"unknown scheduling policy {self.scheduling_policy!r}")
        for name in (
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "kv_cache_tokens",
            "block_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        # vLLM's SchedulerConfig refuses the same: every running sequence's decode must fit.
        if self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs})"
            )
        if self.prefill_tokens_per_s <= 0:
            raise ValueError("prefill_tokens_per_s must be > 0")
        if self.decode_step_ms < 0 or self.decode_step_ms_per_seq < 0 or self.time_scale < 0:
            raise ValueError("decode step times and time_scale must be >= 0")
        if self.embedding_dim < 1:
            raise ValueError("embedding_dim must be >= 1")
        # vLLM refuses to start when one full-length sequence cannot fit in the KV cache.
        if self.kv_cache_tokens < self.max_model_len:
            raise ValueError(
                f"kv_cache_tokens ({self.kv_cache_tokens}) must be >= max_model_len "
                f"({self.max_model_len}): one full-length sequence must fit"
            )

    @property
    def model_name(self) -> str:
        """The first served name: the one vLLM reports in responses and metric labels."""
        return self.served_model_names[0]

    @property
    def model_root(self) -> str:
        return self.model or self.model_name


def _rate(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    d = SimulatorConfig()
    f = FaultSettings()
    p = argparse.ArgumentParser(
        prog="python -m simulator",
        description="A vLLM stand-in: same HTTP API and metrics, simulated timing.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = p.add_argument
    add("--host", default=d.host, help="address to listen on")
    add("--port", type=int, default=d.port, help="port to listen on")
    add(
        "--served-model-name",
        nargs="+",
        default=list(d.served_model_names),
        help="model name(s) answered to; the first labels metrics",
    )
    add("--model", default=None, help="the model path, reported as `root` in /v1/models")
    add(
        "--kind",
        choices=get_args(ModelKind),
        default=d.kind,
        help=(
            "which API the model serves: chat+completions, the same as a deterministic guard "
            "model (Llama Guard prompts, docs/simulator.md), embeddings or transcriptions"
        ),
    )
    add(
        "--max-model-len",
        type=_positive_int,
        default=d.max_model_len,
        help="context length in tokens",
    )
    add(
        "--max-num-seqs",
        type=_positive_int,
        default=d.max_num_seqs,
        help="most sequences in the running batch",
    )
    add(
        "--enable-chunked-prefill",
        action=argparse.BooleanOptionalAction,
        default=d.enable_chunked_prefill,
        help=(
            "prefill long prompts in chunks within each step's token budget, interleaved "
            "with decodes (vLLM V1's default); off: a prompt is prefilled whole in one step "
            "that stalls the batch"
        ),
    )
    add(
        "--max-num-batched-tokens",
        type=_positive_int,
        default=d.max_num_batched_tokens,
        help="token budget of one engine step with chunked prefill (decodes + prefill chunks)",
    )
    add(
        "--kv-cache-tokens",
        type=_positive_int,
        default=d.kv_cache_tokens,
        help="KV cache budget in tokens",
    )
    add(
        "--block-size",
        type=_positive_int,
        default=d.block_size,
        help="KV block size in tokens (prefix-cache granularity)",
    )
    add(
        "--prefill-tokens-per-s",
        type=float,
        default=d.prefill_tokens_per_s,
        help="prompt tokens prefilled per second",
    )
    add(
        "--decode-step-ms",
        type=_non_negative,
        default=d.decode_step_ms,
        help="decode step time at batch size 1",
    )
    add(
        "--decode-step-ms-per-seq",
        type=_non_negative,
        default=d.decode_step_ms_per_seq,
        help="added to each decode step per running sequence",
    )
    add(
        "--time-scale",
        type=_non_negative,
        default=d.time_scale,
        help="multiplies all simulated time; 0 answers as fast as possible",
    )
    add(
        "--scheduling-policy",
        choices=get_args(SchedulingPolicy),
        default=d.scheduling_policy,
        help="fcfs, or priority: lowest `priority` value admitted first",
    )
    add(
        "--embedding-dim",
        type=_positive_int,
        default=d.embedding_dim,
        help="embedding vector size (--kind embedding)",
    )
    add(
        "--no-matryoshka",
        dest="matryoshka",
        action="store_false",
        help="refuse `dimensions` like a non-Matryoshka model (e.g. all-MiniLM-L6-v2)",
    )
    add("--seed", type=int, default=d.seed, help="seeds fault draws and generated text")
    add(
        "--fault-error-rate",
        type=_rate,
        default=f.error_rate,
        help="fraction of requests answered 500",
    )
    add(
        "--fault-hang-rate",
        type=_rate,
        default=f.hang_rate,
        help="fraction of requests never answered until the client leaves",
    )
    add(
        "--fault-slow-first-byte-ms",
        type=_non_negative,
        default=f.slow_first_byte_ms,
        help="delay before every response starts (not scaled by --time-scale)",
    )
    add(
        "--fault-die-mid-stream-rate",
        type=_rate,
        default=f.die_mid_stream_rate,
        help="fraction of streams whose connection drops after a few tokens",
    )
    add(
        "--fault-die-after-requests",
        type=_positive_int,
        default=None,
        help="exit abruptly (os._exit) after answering this many requests",
    )
    return p  # fmt: skip


def parse_args(argv: Sequence[str] | None = None) -> SimulatorConfig:
    """Build the configuration from command-line arguments (``sys.argv[1:]`` when None)."""
    parser = build_parser()
    a = parser.parse_args(argv)
    try:
        return SimulatorConfig(
            served_model_names=tuple(a.served_model_name),
            model=a.model,
            host=a.host,
            port=a.port,
            kind=a.kind,
            max_model_len=a.max_model_len,
            max_num_seqs=a.max_num_seqs,
            enable_chunked_prefill=a.enable_chunked_prefill,
            max_num_batched_tokens=a.max_num_batched_tokens,
            kv_cache_tokens=a.kv_cache_tokens,
            block_size=a.block_size,
            prefill_tokens_per_s=a.prefill_tokens_per_s,
            decode_step_ms=a.decode_step_ms,
            decode_step_ms_per_seq=a.decode_step_ms_per_seq,
            time_scale=a.time_scale,
            scheduling_policy=a.scheduling_policy,
            embedding_dim=a.embedding_dim,
            matryoshka=a.matryoshka,
            seed=a.seed,
            faults=FaultSettings(
                error_rate=a.fault_error_rate,
                hang_rate=a.fault_hang_rate,
                slow_first_byte_ms=a.fault_slow_first_byte_ms,
                die_mid_stream_rate=a.fault_die_mid_stream_rate,
                die_after_requests=a.fault_die_after_requests,
            ),
        )
    except ValueError as exc:
        parser.error(str(exc))
