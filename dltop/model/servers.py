"""The inference-server part of a Snapshot: what each vLLM or SGLang server says about its KV-cache pool.

One `ServerStats` per configured URL, whatever happened: a server that is down, hangs, redirects elsewhere, needs
authentication or answers garbage keeps its place with `state` and `error` saying so, and every number it could
not give is `Unavailable(reason)`. Counters (prefix-cache hits and queries, preemptions) are stored raw; their
rates over an interval come from two Snapshots (`dltop.derive.server_rates`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dltop.model.base import Unavailable

# What a scrape came to. "ok": the numbers below are the server's; anything else: `error` says what went wrong.
STATES = ("ok", "waiting", "down", "timeout", "redirect", "auth", "http_error", "too_large", "garbage",
          "not_inference", "error")


@dataclass(frozen=True)
class ModelStats:
    """One model (one `model_name` label; a V1 data-parallel engine or an SGLang dp rank apart) behind a server."""

    model_name: str
    replica: str | None = None  # "engine=0" (vLLM V1), "dp_rank=1" (SGLang); None when there is one
    kv_usage: float | Unavailable = Unavailable("not read")  # fraction of the KV pool in use, 0..1
    kv_capacity_tokens: int | Unavailable = Unavailable("not read")
    kv_cache_dtype: str | None = None  # vLLM's cache_config_info cache_dtype ("auto", "fp8"); None: not given
    kv_used_tokens: int | Unavailable = Unavailable("not read")  # SGLang's num_used_tokens; vLLM gives none
    # The engine's own hit rate (vLLM V0's gauge, SGLang's cache_hit_rate); vLLM V1 gives counters instead.
    prefix_cache_hit_rate: float | Unavailable = Unavailable("not read")
    prefix_cache_hits_total: float | None = None  # vLLM V1 counters, in tokens; None: not given
    prefix_cache_queries_total: float | None = None
    running_requests: int | Unavailable = Unavailable("not read")
    waiting_requests: int | Unavailable = Unavailable("not read")
    swapped_requests: int | None = None  # vLLM V0 only
    preemptions_total: int | Unavailable = Unavailable("not read")  # vLLM's counter; SGLang's retractions aren't


@dataclass(frozen=True)
class ServerStats:
    """One server's scrape: its engine, KV pool and prefix cache (the totals over its models), and its process."""

    url: str
    state: str = "waiting"  # one of STATES
    error: str | None = None  # one line saying what went wrong when state is not "ok"
    engine: str | Unavailable = Unavailable("not read")  # "vllm" or "sglang"
    kv_usage: float | Unavailable = Unavailable("not read")
    kv_capacity_tokens: int | Unavailable = Unavailable("not read")
    kv_capacity_bytes: int | Unavailable = Unavailable("not read")
    prefix_cache_hit_rate: float | Unavailable = Unavailable("not read")
    models: tuple[ModelStats, ...] = ()
    pid: int | Unavailable = Unavailable("not read")  # the process listening on the URL's port
    child_pids: tuple[int, ...] = ()  # its descendants (vLLM V1's EngineCore holds the GPU memory)
    scraped_at: float | None = None  # wall-clock time the answer came in
    scrape_s: float | None = None
    payload_bytes: int | None = None
    notes: tuple[str, ...] = ()  # numbers that disagree, metrics missing, values that were not finite
    # The Sampler's word when a read has run past its time (numbers, if any, are the last answer's).
    source_error: str | None = None
