"""The result envelope's models (and, for now, the helpers that build its parts): what the runner
signs and exports about a job.
"""
