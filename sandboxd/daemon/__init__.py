"""The daemon's lifecycle: assembling it, its services and shared context, start checks, readiness, the twistd plugin's options, hardening at start."""
