"""dev.py without running its commands: the children's argv."""
from __future__ import annotations

import dev


def test_no_child_has_a_secret_in_its_argv() -> None:
    """The supervised processes' argv hold no credentials (Flower gets FLOWER_BASIC_AUTH from its environment)."""
    for name, argv in dev.child_commands(web_port=8000, flower_port=5555).items():
        assert not any("basic-auth" in part or "password" in part.lower() for part in argv), name
