"""The eval layer's one error type: a ValueError whose message names the cause and the fix (headstart/errors.py
turns it into one line and exit 2 at the command line). A leaf module, so any eval module can raise it."""


class EvalError(ValueError):
    """Bad eval input (prompts, checkpoint, options); the message names the cause and the fix."""
