"""PyTorch on Spark ML: ``TorchEstimator`` trains a ``torch.nn.Module`` with Horovod, ``TorchModel``
predicts."""
from horovod.spark.torch.estimator import TorchEstimator, TorchModel

__all__ = ["TorchEstimator", "TorchModel"]
