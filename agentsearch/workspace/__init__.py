"""The target repository: git, worktrees, proposals, merges. The only package that runs git."""

from .workspace import Proposal, Violation, Workspace, new_episode_id, slugify

__all__ = ["Proposal", "Violation", "Workspace", "new_episode_id", "slugify"]
