"""hpctorch: what a training script imports to get what hpcjob's own example gets.

hpcjob ships this package with each job: the tasks find it on their PYTHONPATH (the job folder's
`.hpcjob/lib`, which `.hpcjob/node.sh` puts first), in a job environment, in the nodes' own Python and
in an image alike; it is also in hpcjob's wheel. It runs on the nodes' oldest Python (3.6), imports
only the standard library when imported (torch inside the calls that need it), and is harmless without
hpcjob: under plain torchrun its figures go to the console.

    from hpctorch import Metrics

    metrics = Metrics()                          # where the training loop begins, on every rank
    for step, (x, y) in enumerate(loader):
        ...
        metrics.step(samples=len(x), loss=loss.item())
    metrics.summary(accuracy=0.97)               # every rank: the HPCJOB_METRICS line, on rank 0

    checkpoints = Checkpoints(every_steps=500)   # the run's own folder, asynchronous DCP saves
    start = checkpoints.resume(model, optimizer) # a retried attempt, or --resume-from: the newest save
    ...
    checkpoints.step(step, model, optimizer)     # after each step: a save when one is due
    checkpoints.close(step, model, optimizer)    # the last step saved, every save marked

`hpcjob runs`, `runs plot`, `status` and the run's summary then show the script as they show the
example (samples/s, data wait, its figures over time).
"""

from hpctorch.checkpoint import CheckpointError, Checkpoints
from hpctorch.metrics import METRICS_PREFIX, Metrics

__all__ = ["METRICS_PREFIX", "CheckpointError", "Checkpoints", "Metrics"]
