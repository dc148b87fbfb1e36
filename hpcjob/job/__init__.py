"""The pure core: what the user asks for, turned into the job and its artefacts. No I/O."""
