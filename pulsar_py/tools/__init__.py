"""The command-line tools: ``pulsar-py demo|render|sample|selftest|gradcheck|bench|info``.
The renderer itself never imports this package."""
