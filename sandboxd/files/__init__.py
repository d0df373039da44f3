# -*- test-case-name: tests.routes.test_files -*-
"""
The file_ops group's machinery, one concern per module: atomic writes
(:mod:`.atomic`), streamed reads (:mod:`.stream`), directory walks
(:mod:`.walk`), archives (:mod:`.archive`) and watches (:mod:`.watch`).
"""
