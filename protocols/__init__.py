"""Every message and wire format of the emulator.

Type-tag ranges (stable; never reuse a tag):

* 1-99     engine-internal records (``emulator``)
* 100-199  the demo machine (``actors.demo``)
* 200-499  the AHBM machine
* 500-799  the pccx v002 machine
"""
from protocols.codec import ProtocolError, TensorDesc, decode, encode, message, registered, type_name

__all__ = ["ProtocolError", "TensorDesc", "decode", "encode", "message", "registered", "type_name"]
