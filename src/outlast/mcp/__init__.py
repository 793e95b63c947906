"""The Model Context Protocol edge: ``outlast mcp`` serves the store's jobs to an agent.

Built on the official ``mcp`` SDK (the ``outlast[mcp]`` extra); importing this package does
not import it, :func:`outlast.mcp.server.build` does.
"""
