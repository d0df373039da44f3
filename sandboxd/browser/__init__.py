# -*- test-case-name: tests.browser.test_browser -*-
"""
The headless browser (SPEC §7.8): a Playwright worker child process
(:mod:`sandboxd.browser.worker`), its supervisor in the daemon
(:mod:`sandboxd.browser.supervisor`) and the URL rules both apply
(:mod:`sandboxd.browser.urlpolicy`).
"""
