"""Local stand-ins for the outside world, served over real HTTP on loopback."""
