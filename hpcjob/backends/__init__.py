"""Backends run a JobPlan somewhere and report on it. They never build command lines themselves."""
