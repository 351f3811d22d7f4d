"""The failures a tool reports to the model, in a module of their own so that the workspace
(which raises them) and the tool machinery (`base`, which uses the workspace) import it
without importing each other."""


class ToolError(Exception):
    """Raised by a tool to report a failure the model should see verbatim."""


class ToolArgumentError(ToolError):
    pass
