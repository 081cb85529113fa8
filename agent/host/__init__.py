"""The host: path arithmetic of the layout, the ``Host`` port adapter (links, slots, staging), provisioning,
the install record, the ownership policy of the agent's state, the host lock, published results and the
clock.
"""
