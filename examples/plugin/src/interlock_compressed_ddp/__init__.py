"""DDP that sends gradients over the wire in float16, halving communication.

The strategy (``strategy.CompressedDDPStrategy``) declares the rounding as its parity
tolerance (``spec.specs``), and the interlock conformance suite holds it to that.
"""
