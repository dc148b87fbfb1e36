"""`hpcjob doctor`: the checks, their verdicts and the probes the nodes run."""
