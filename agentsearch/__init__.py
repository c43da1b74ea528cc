"""agentsearch: git-native patch search for LLM-inference optimization."""

__version__ = "0.8.0"
