"""The one internal client API every protocol calls models through."""
