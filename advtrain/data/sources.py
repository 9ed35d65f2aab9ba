"""Registry of data sources: each turns a DataConfig into DataSplits."""

from advtrain.registry import Registry

sources = Registry("data source")
register_source = sources.register
