import json

import numpy as np
import pytest
import tensorflow as tf
from helpers import on_replicas

from advtrain.data import cache_mode, make_input, make_replica_input
from advtrain.data.pipeline import _shuffle_buffer


def _dataset(n=40):
    # Image i is filled with i, so a batch tells which examples it holds.
    images = np.repeat(np.arange(n, dtype=np.uint8), 8 * 8 * 3).reshape(n, 8, 8, 3)
    return tf.data.Dataset.from_tensor_slices((images, np.arange(n, dtype=np.int64)))


def test_training_batches_are_shuffled_unit_floats():
    batches = list(
        make_input(_dataset(), shuffle_buffer=100, batch_size=16, training=True)
    )
    assert [b[0].shape for b in batches] == [(16, 8, 8, 3)] * 2  # drops 8
    images, labels = batches[0]
    assert images.dtype == tf.float32
    np.testing.assert_allclose(images[:, 0, 0, 0], labels.numpy() / 255.0)
    assert sorted(labels.numpy()) != list(range(16))


def test_shuffle_buffer_is_capped_by_bytes():
    big = tf.data.Dataset.from_tensors(
        (tf.zeros([224, 224, 3], tf.uint8), tf.constant(0, tf.int64))
    )
    assert _shuffle_buffer(big, 10_000) == (256 << 20) // (224 * 224 * 3)
    assert _shuffle_buffer(_dataset(), 10_000) == 10_000


def test_evaluation_keeps_order_and_every_example():
    batches = list(make_input(_dataset(), cache="none", batch_size=16, training=False))
    labels = np.concatenate([b[1].numpy() for b in batches])
    np.testing.assert_array_equal(labels, np.arange(40))


def test_file_cache(tmp_path):
    cache = str(tmp_path / "cache")
    ds = make_input(_dataset(), cache=cache, batch_size=8, training=False)
    assert len(list(ds)) == 5 and len(list(ds)) == 5
    assert any(p.name.startswith("cache") for p in tmp_path.iterdir())


def test_deterministic_order_and_augmentation_repeat():
    aug = dict(random_crop_pad=2, brightness=0.2, contrast=0.3)

    def first_epoch():
        ds = make_input(
            _dataset(),
            deterministic=True,
            augment=aug,
            seed=5,
            batch_size=10,
            training=True,
        )
        return [b[0].numpy() for b in ds], [b[1].numpy() for b in ds]

    (a, la), (b, lb) = first_epoch(), first_epoch()
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(la[0], lb[0])
    images = np.concatenate(a)
    assert images.min() >= 0.0 and images.max() <= 1.0


def test_random_crop_moves_content_in_from_the_padding():
    # Images 1..40 (no zero pixel anywhere) and the crop alone: every zero
    # pixel after augmentation is padding the crop brought in.
    images = np.repeat(np.arange(1, 41, dtype=np.uint8), 8 * 8 * 3).reshape(40, 8, 8, 3)
    ds = tf.data.Dataset.from_tensor_slices((images, np.arange(40, dtype=np.int64)))
    batch = next(
        iter(
            make_input(
                ds, deterministic=True, augment={"random_crop_pad": 2}, seed=5,
                batch_size=40, training=True,
            )
        )
    )[0].numpy()  # fmt: skip
    padded = (batch == 0).all(axis=-1)  # (40, 8, 8): pixels from the padding
    assert padded.any(axis=(1, 2)).mean() > 0.5  # most images moved
    # Padding enters as whole rows or columns at the border, never inside.
    assert not padded[:, 2:6, 2:6].any()


def test_epochs_reshuffle_and_reaugment():
    ds = make_input(
        _dataset(),
        augment={"brightness": 0.3},
        deterministic=True,
        batch_size=40,
        training=True,
    )
    (x1, y1), (x2, y2) = list(ds)[0], list(ds)[0]
    assert not np.array_equal(y1, y2)
    order = np.argsort(y2.numpy())
    same = np.argsort(y1.numpy())
    assert not np.allclose(x1.numpy()[same], x2.numpy()[order])


def test_replica_input_shards_per_pipeline():
    seen = []
    for pipeline in range(2):
        context = tf.distribute.InputContext(
            num_input_pipelines=2,
            input_pipeline_id=pipeline,
            num_replicas_in_sync=4,
        )
        ds = make_replica_input(
            _dataset,
            context,
            global_batch=8,
            training=True,
            cache="none",
            shuffle_buffer=1000,
        )
        batches = list(ds)
        assert {b[1].shape[0] for b in batches} == {2}  # 8 / 4 replicas
        labels = np.concatenate([b[1].numpy() for b in batches])
        assert len(set(labels)) == len(labels) == 20
        seen.append(set(labels))
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == set(range(40))


def test_replica_input_rejects_uneven_batch():
    context = tf.distribute.InputContext(num_replicas_in_sync=3)
    with pytest.raises(ValueError, match="divisible by the 3 replicas"):
        make_replica_input(_dataset(), context, global_batch=8, training=True)


_MIRRORED = on_replicas(
    "mirrored_input",
    """
    import json
    import tensorflow as tf
    from advtrain.data import make_distributed_input

    strategy = runtime.strategy  # MirroredStrategy over two logical CPUs
    images = np.zeros((32, 4, 4, 1), np.uint8)
    ds = tf.data.Dataset.from_tensor_slices((images, np.arange(32)))
    dist = make_distributed_input(ds, strategy, global_batch=8, training=True)
    steps = []
    for x, y in dist:
        per_replica = strategy.experimental_local_results(y)
        steps.append([r.numpy().tolist() for r in per_replica])
    replicas = strategy.num_replicas_in_sync
    np.savez(out, result=json.dumps({"replicas": replicas, "steps": steps}))
    """,
    replicas=(2,),
)


@pytest.mark.replicas(_MIRRORED)  # logical CPUs precede TensorFlow's start
def test_mirrored_replicas_get_distinct_examples(replica_runs):
    result = json.loads(str(replica_runs(_MIRRORED)[2]["result"]))
    assert result["replicas"] == 2
    assert len(result["steps"]) == 4
    labels = []
    for step in result["steps"]:
        assert [len(r) for r in step] == [4, 4]  # 8 / 2 replicas
        assert not set(step[0]) & set(step[1])
        labels += step[0] + step[1]
    assert sorted(labels) == list(range(32))


def test_augment_rejects_an_unknown_key():
    with pytest.raises(TypeError, match="Received: flip=True"):
        make_input(_dataset(), augment={"flip": True}, batch_size=8, training=True)


def test_cache_auto_keeps_bounded_sources_in_memory():
    assert cache_mode("auto", "digits") == "memory"
    assert cache_mode("auto", "arrays") == "none"
    assert cache_mode("auto", None) == "none"
    assert cache_mode("/tmp/c", "digits") == "/tmp/c"
