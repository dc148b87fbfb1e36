"""hpcjob: run PyTorch DistributedDataParallel training on Microsoft HPC Pack clusters."""
