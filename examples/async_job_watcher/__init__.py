"""The async job watcher: spawn a detached export, poll it until READY, verify its artifact,
and always clean up (the third seed made real; see SKILL.md)."""
