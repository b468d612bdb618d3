"""A small MCP server over stdio for the fault proxy's tests: ``echo`` answers its text, ``count`` how many
calls this process has served, ``pid`` its process id, ``die`` ends the process without an answer (a dying upstream);
a resource ``notes://today``, a template ``notes://{day}`` and a prompt ``greet``."""

import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("echo")
served = 0


@server.tool()
def echo(text: str) -> str:
    """Answer the text."""
    global served
    served += 1
    return text


@server.tool()
def count() -> int:
    """How many echo calls this process has served."""
    return served


@server.tool()
def pid() -> int:
    """This process's id."""
    return os.getpid()


@server.tool()
def die() -> str:
    """End the process without answering."""
    os._exit(7)


@server.resource("notes://today", description="Today's note.")
def today() -> str:
    return "buy milk"


@server.resource("notes://{day}", description="The note of a day.")
def note(day: str) -> str:
    return f"the note of {day}"


@server.prompt(description="A greeting.")
def greet(name: str) -> str:
    return f"Say hello to {name}."


if __name__ == "__main__":
    server.run()
