"""rollout-engine for trainers: drive the engine's control API from Python.

    import rollout_engine as re
    with re.launch() as engine:                      # `rollout serve` on a free port, with a token
        client = engine.client()
        for batch in client.batches(start_step=1, steps=10):
            if not isinstance(batch, re.Batch):      # ExpiredBatch / WeightUpdateInProgress
                with client.weight_update(model_step=batch.train_step - 1):
                    ...                              # load the weights into the inference servers
                continue
            samples = batch.samples()                # token ids, action masks, logprobs, GRPO advantages

``rollout_engine.collate`` (needs torch) turns samples into padded tensors.
"""
from .batch import ROUTED_FILL, Batch, Group, Rollout, RoutedExperts, Sample, Sampling, SamplingMask, SideCall, Stitched, Turn, decode_batch
from .client import BatchOutcome, ControlClient, ExpiredBatch, RetryPolicy, WeightUpdateInProgress
from .errors import BatchFormatError, ControlApiError, EngineUnreachableError, LaunchError, RolloutEngineError
from .launch import LaunchedEngine, default_command, launch

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "BatchFormatError",
    "BatchOutcome",
    "ControlApiError",
    "ControlClient",
    "EngineUnreachableError",
    "ExpiredBatch",
    "Group",
    "LaunchError",
    "LaunchedEngine",
    "RetryPolicy",
    "Rollout",
    "RolloutEngineError",
    "Sample",
    "RoutedExperts",
    "SamplingMask",
    "ROUTED_FILL",
    "Sampling",
    "SideCall",
    "Stitched",
    "Turn",
    "WeightUpdateInProgress",
    "decode_batch",
    "default_command",
    "launch",
]
