"""The runner's own ground floor: errors and their categories, logging, safe file access, file
locks, host identity, safe archives, bounded JSON, secret redaction. Imports nothing else of the
runner.
"""
