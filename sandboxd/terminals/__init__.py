"""
Terminals (SPEC §7.5, §8): PTY sessions with their scrollback
(:mod:`~sandboxd.terminals.session`), the WebSocket that attaches clients to
them (:mod:`~sandboxd.terminals.websocket`), and the group service that
owns both (:mod:`~sandboxd.terminals.service`).
"""
