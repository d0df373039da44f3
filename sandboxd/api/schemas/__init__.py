"""Each group's endpoint schemas, one module per group (keyed by endpoint id)."""
