"""The engine: prefill and decode (`stages`), a whole timed reply (`reply`), the state between
the stages and its file (`state`), a chat session (`chat`), latency sweeps (`latency`), where a
decode step spends its time and decode rates side by side (`profile`), the passkey retrieval task
(`passkey`), cache kinds compared at equal bytes (`compression`)."""
from labkit.generation.reply import GenerationOutput, generate, stream
from labkit.generation.stages import decode, decode_with_checkpoints, prefill
from labkit.generation.state import PrefillState

__all__ = ["prefill", "decode", "decode_with_checkpoints", "generate", "stream", "PrefillState", "GenerationOutput"]
