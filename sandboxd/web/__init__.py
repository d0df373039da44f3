"""The HTTP side: request pipeline, routing, responses, SSE."""
