"""Interview Dojo: lessons, labs and 60-second drills for a senior backend interview."""

__version__ = "0.1.0"
