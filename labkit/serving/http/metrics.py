"""`/metrics`: the server's state and latencies in the Prometheus text format (`prometheus_client`).

Names follow vLLM's where there is an equivalent (`vllm:num_requests_running` is
`labkit:num_requests_running` here), so a dashboard written for one reads the other:

| metric | kind | what |
|---|---|---|
| `labkit:num_requests_running` / `_waiting` | gauge | requests decoding now / queued |
| `labkit:kv_cache_usage_perc` | gauge | share of the KV blocks in use (0-1) |
| `labkit:kv_cache_tokens` | gauge | tokens the KV pool holds in all |
| `labkit:time_to_first_token_seconds` | histogram | arrival to first token |
| `labkit:inter_token_latency_seconds` | histogram | gaps between tokens |
| `labkit:prompt_tokens_total` / `labkit:generation_tokens_total` | counter | tokens in / out |
| `labkit:prefix_cache_hit_tokens_total` | counter | prompt tokens found in the prefix cache (÷ prompt tokens: the hit rate) |
| `labkit:request_success_total{finished_reason}` | counter | requests that ended normally ("stop", "length") |
| `labkit:num_requests_aborted_total{reason}` | counter | ended early ("abort": client left, "timeout", "rejected": its parameters could not sample, "error") |
| `labkit:num_requests_rejected_total` | counter | refused with 429 (queue full) |
| `labkit:spec_decode_num_draft_tokens_total{drafter}` / `_accepted_tokens_total{drafter}` | counter | drafted tokens verified / accepted, by drafter ("prompt-lookup", "mtp", "zero-copy", "medusa"; only when the server speculates) |

Each server has its own registry, so two servers in one process never mix their counts.
"""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["ServerMetrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)


class ServerMetrics:
    """The counters a server updates (`finished(req)` from the engine thread) and renders (`render(stats)`)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str, drafter: str | None = None):
        self.registry = r = CollectorRegistry()
        self.drafter = drafter
        self.running = Gauge("labkit:num_requests_running", "Requests decoding now.", registry=r)
        self.waiting = Gauge("labkit:num_requests_waiting", "Requests waiting to run.", registry=r)
        self.kv_usage = Gauge("labkit:kv_cache_usage_perc", "Share of KV cache blocks in use (0-1).", registry=r)
        self.kv_tokens = Gauge("labkit:kv_cache_tokens", "Tokens the KV cache pool holds in all.", registry=r)
        self.ttft = Histogram("labkit:time_to_first_token_seconds", "Arrival to first token.", buckets=_LATENCY_BUCKETS,
                              registry=r)
        self.itl = Histogram("labkit:inter_token_latency_seconds", "Gaps between generated tokens.",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("labkit:prompt_tokens", "Prompt tokens of finished requests.", registry=r)
        self.cached_tokens = Counter("labkit:prefix_cache_hit_tokens", "Prompt tokens found in the prefix cache.",
                                     registry=r)
        self.generation_tokens = Counter("labkit:generation_tokens", "Tokens generated.", registry=r)
        self.success = Counter("labkit:request_success", "Requests that ended normally.", ["finished_reason"], registry=r)
        self.aborted = Counter("labkit:num_requests_aborted", "Requests ended early.", ["reason"], registry=r)
        self.rejected = Counter("labkit:num_requests_rejected", "Requests refused because the queue was full.", registry=r)
        self.drafted = Counter("labkit:spec_decode_num_draft_tokens", "Drafted tokens verified.", ["drafter"], registry=r)
        self.accepted = Counter("labkit:spec_decode_num_accepted_tokens", "Drafted tokens accepted.", ["drafter"],
                                registry=r)
        if drafter is not None:  # the series exist from the start (0 until a request ends)
            self.drafted.labels(drafter), self.accepted.labels(drafter)

    def finished(self, req) -> None:
        """A request ended (any reason): count its tokens and latencies."""
        self.prompt_tokens.inc(len(req.prompt))
        self.cached_tokens.inc(min(req.cached_tokens, len(req.prompt)))
        self.generation_tokens.inc(len(req.output))
        if self.drafter is not None:
            self.drafted.labels(self.drafter).inc(req.drafted)
            self.accepted.labels(self.drafter).inc(req.accepted)
        if req.ttft is not None:
            self.ttft.observe(req.ttft)
        for gap in req.itls:
            self.itl.observe(gap)
        if req.finish_reason in ("stop", "length"):
            self.success.labels(req.finish_reason).inc()
        else:
            self.aborted.labels(req.finish_reason or "abort").inc()

    def render(self, stats: dict) -> bytes:
        self.running.set(stats["running"])
        self.waiting.set(stats["waiting"])
        self.kv_usage.set(stats["kv_blocks_used"] / max(1, stats["kv_blocks"]))
        self.kv_tokens.set(stats["kv_tokens"])
        return generate_latest(self.registry)
