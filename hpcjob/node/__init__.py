"""What runs on the nodes: the task helper (node.sh), the rank shim (worker.py) and the execution filter
(filter.sh, mount_filter.py). The client reads the filter's own rules (what a share entry may hold, a
job owner's name on a node) from mount_filter.py, so both sides apply one set."""
