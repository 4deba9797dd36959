"""Typed async clients of the hub: the fleet API for users and the CLI, the member API for hub
links, and the tokens and channels both need."""
