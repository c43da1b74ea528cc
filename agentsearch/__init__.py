"""agentsearch: git-native patch search for LLM-inference optimization."""

__version__ = "0.9.0"
