"""The supervisor's monitoring: log steps timed at arrival, every detector headless, alerts and their delivery."""
