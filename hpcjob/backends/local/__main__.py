"""`python -m hpcjob.backends.local`: the process that runs one local job (LocalBackend.submit starts it)."""

import sys

from hpcjob.backends.local import supervise

sys.exit(supervise())
