"""Programs `hpcjob doctor` runs on the nodes; each is uploaded to the share with this folder."""
