"""The starter agentsearch.toml (and serving.json) written into the embedded vLLM fork.

The config is data: ``templates/starter.toml.j2``, rendered with the one value that depends on the
machine (where the installed vLLM lives)."""

from __future__ import annotations

import json
from pathlib import Path

import templates as _templates

# The fork's serving config: engine arguments and environment that proposals may change
# (this is how configuration proposals work). A conservative batch limit to start from.
STARTER_SERVING = {"engine": {"max_num_seqs": 4, "max_num_batched_tokens": 2048}, "env": {}}
STARTER_TEMPLATE = "starter.toml.j2"


def starter_serving() -> str:
    return json.dumps(STARTER_SERVING, indent=2) + "\n"


def starter_config(site_packages: Path) -> str:
    """The starter agentsearch.toml, overlaying the installed vLLM found in ``site_packages``."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(_templates.__file__).resolve().parent)),
        autoescape=False,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    return env.get_template(STARTER_TEMPLATE).render(site_packages=site_packages)
