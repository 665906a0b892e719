"""Real devices: the inventory, SSH (strict host keys, quoted commands, uploads, tunnels), installing the
runtime and RPC server, the server's lifecycle, RPC sessions through tunnels, checks, and the farm."""
