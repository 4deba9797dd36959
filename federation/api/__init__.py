"""Generated protobuf and gRPC code (``make generate`` from ``proto/federation/api``); never
edited by hand. ``common`` holds the messages both services speak, ``member`` the hub links'
MemberService, ``fleet`` the users' FleetService."""
