"""The cost model: hardware profiles, workload (FLOPs and bytes), roofline time, memory levels, DVFS tables.

Pure functions of a model config and a hardware profile: nothing here runs a model.
`serving.py` turns it into serving numbers: the critical decode batch, tokens/s per batch, TP x DP layouts, $ per 1M tokens.
`measure.py` micro-benchmarks this machine (no model) for the `this-machine` profile.
"""
from labkit.costmodel.estimator import Estimate, check_settings, diagnose, estimate, ridge_tokens
from labkit.costmodel.profiles import HARDWARE, Hardware, hardware, precision_for, profile_table, this_machine
from labkit.costmodel.serving import (LLAMA3_70B, compare_plans, cost_per_million_tokens, critical_batch,
                                      decode_throughput, parallel_plan, pass_time)
from labkit.costmodel.workload import kv_bytes_per_token

__all__ = ["estimate", "Estimate", "hardware", "HARDWARE", "Hardware", "this_machine", "profile_table",
           "precision_for", "ridge_tokens", "kv_bytes_per_token", "check_settings", "diagnose",
           "critical_batch", "decode_throughput", "parallel_plan", "compare_plans", "cost_per_million_tokens", "pass_time",
           "LLAMA3_70B"]
