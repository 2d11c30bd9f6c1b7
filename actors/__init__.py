"""Hardware actors and machine builders, one sub-package per machine family.

``actors.registry`` maps a machine profile's ``family`` to the module that
builds it and lists its workloads.
"""
