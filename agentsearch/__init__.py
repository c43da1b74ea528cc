"""agentsearch: git-native patch search for LLM-inference optimization."""

__version__ = "0.7.0"
