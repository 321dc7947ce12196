"""rankwatch: watches each rank of a distributed training job from outside its process."""

__version__ = "0.1.0"
