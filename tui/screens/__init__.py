"""Screens: home (runs list), run (one attempt), preflight and confirmation modals, help."""
