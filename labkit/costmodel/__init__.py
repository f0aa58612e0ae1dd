"""The cost model: hardware profiles, workload (FLOPs and bytes), roofline time, memory levels, DVFS tables.

Pure functions of a model config and a hardware profile: nothing here runs a model.
`measure.py` micro-benchmarks this machine (no model) for the `this-machine` profile.
"""
from labkit.costmodel.estimator import Estimate, check_settings, diagnose, estimate, ridge_tokens
from labkit.costmodel.profiles import HARDWARE, Hardware, hardware, precision_for, profile_table, this_machine
from labkit.costmodel.workload import kv_bytes_per_token

__all__ = ["estimate", "Estimate", "hardware", "HARDWARE", "Hardware", "this_machine", "profile_table",
           "precision_for", "ridge_tokens", "kv_bytes_per_token", "check_settings", "diagnose"]
