"""Policy videos: offscreen frames with the goal marked and each episode's result on them,
``python -m her_mpi.evaluate --video`` and ``log.video_every`` during training (real mpirun)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from PIL import Image

from helpers import TINY, describe, read_progress, run_mpi
from deploy_policies import exported_policy
from her_mpi import video
from her_mpi.config import EnvConfig
from her_mpi.envs.bit_flipping import BitFlippingEnv


@pytest.fixture
def headless_gl(monkeypatch):
    """MUJOCO_GL for frames rendered in this process, as the CLIs choose it (restored after the
    test; the subprocesses below choose for themselves)."""
    if "MUJOCO_GL" not in os.environ and not os.environ.get("DISPLAY"):
        monkeypatch.setenv("MUJOCO_GL", "egl")


def near(image: np.ndarray, color, tolerance: int = 60) -> np.ndarray:
    """Mask of pixels within ``tolerance`` of ``color`` in every channel."""
    return np.all(np.abs(image[..., :3].astype(int) - np.asarray(color)) <= tolerance, axis=-1)


def tinted(region: np.ndarray, color) -> int:
    """Pixels whose dominant channel is ``color``'s (anti-aliased caption text on black)."""
    channel = int(np.argmax(color))
    values = region[..., :3].astype(int)
    others = np.delete(values, channel, axis=-1).max(axis=-1)
    return int((values[..., channel] - others > 30).sum())


def red(image: np.ndarray) -> np.ndarray:
    """Mask of the red of Fetch's target sphere (shaded) and of its ring."""
    r, g, b = (image[..., i].astype(int) for i in range(3))
    return (r > 120) & (g < 70) & (b < 70)


def ring_pixels(image: np.ndarray, center, radius: float, color) -> int:
    """Pixels of ``color`` on the annulus a ring of ``radius`` around ``center`` would cover."""
    rows, cols = np.mgrid[: image.shape[0], : image.shape[1]]
    distance = np.hypot(cols - center[0], rows - center[1])
    return int((near(image, color) & (np.abs(distance - radius) <= 3)).sum())


# -- choosing the OpenGL backend ---------------------------------------------------------------


def test_gl_backend_is_egl_without_a_display_and_the_users_choice_otherwise():
    environ = {}
    assert "egl" in video.select_gl_backend(environ) and environ["MUJOCO_GL"] == "egl"
    environ = {"DISPLAY": ":0"}
    assert "glfw" in video.select_gl_backend(environ) and "MUJOCO_GL" not in environ
    environ = {"MUJOCO_GL": "osmesa"}
    assert "osmesa" in video.select_gl_backend(environ) and environ["MUJOCO_GL"] == "osmesa"
    with pytest.raises(video.VideoError, match="MUJOCO_GL='glx'.*expected one of egl, osmesa, glfw"):
        video.select_gl_backend({"MUJOCO_GL": "glx"})


# -- goal markers ------------------------------------------------------------------------------


def test_fetch_goal_ring_sits_on_the_target_the_env_draws(headless_gl):
    render_env = video.RenderEnv(EnvConfig("FetchReach-v4"), 480, 400)
    try:
        env = render_env.env
        (site, color), = render_env.target_sites
        assert color == (255, 0, 0)
        for seed in range(3):
            env.reset(seed=seed)
            raw = np.asarray(env.render())  # the env's own red target sphere, no ring
            sphere = np.argwhere(red(raw))
            assert len(sphere) > 10, f"seed {seed}: FetchReach's target sphere is not in the frame"
            (x, y), = video.project_points(render_env.mujoco_env, env.unwrapped.data.site_xpos[[site]], (480, 400))[0]
            assert abs(x - sphere[:, 1].mean()) < 3 and abs(y - sphere[:, 0].mean()) < 4, (seed, x, y, sphere.mean(0))
            framed = np.asarray(render_env.frame())
            radius = 0.025 * 400
            assert ring_pixels(framed, (x, y), radius, (255, 0, 0)) > 15
    finally:
        render_env.close()


def test_push_goal_is_visible_even_where_the_arm_hides_the_target(headless_gl):
    render_env = video.RenderEnv(EnvConfig("FetchPush-v4"), 240, 240)
    hidden = 0
    try:
        for seed in range(4):
            render_env.env.reset(seed=seed)
            raw = np.asarray(render_env.env.render())
            hidden += red(raw).sum() == 0
            framed = np.asarray(render_env.frame())
            assert red(framed).sum() > 30, f"seed {seed}: no goal marker in the frame"
    finally:
        render_env.close()
    assert hidden >= 1, "no seed hid FetchPush's target: this test no longer shows the rings are needed"


def test_hand_reach_marks_each_fingertip_target_in_its_colour(headless_gl):
    render_env = video.RenderEnv(EnvConfig("HandReach-v3"), 320, 320)
    try:
        render_env.env.reset(seed=3)
        framed = np.asarray(render_env.frame())
        sites = render_env.target_sites
        assert len(sites) == 5
        positions = render_env.mujoco_env.data.site_xpos[[s for s, _ in sites]]
        pixels, depth = video.project_points(render_env.mujoco_env, positions, (320, 320))
        assert np.all(depth > 0)
        for (x, y), (_, color) in zip(pixels, sites):
            assert 0 <= x < 320 and 0 <= y < 320
            assert ring_pixels(framed, (x, y), 0.025 * 320, color) > 10, f"no ring of colour {color} at {(x, y)}"
    finally:
        render_env.close()


# -- drawn envs, captions ----------------------------------------------------------------------


def flip_first_wrong_bit(obs, goal):
    return np.array([[int(np.argmax(obs[0] != goal[0]))]])


def test_bit_flipping_is_drawn_and_each_episode_captioned_with_its_result():
    render_env = video.RenderEnv(EnvConfig("BitFlipping-v0", {"n_bits": 6}), 160, 120)
    assert render_env.env.unwrapped.render_size == (160, 120)  # the env draws its own frames, at the video's size
    summaries = []
    frames = list(video.episode_frames(render_env, flip_first_wrong_bit, 2, 0, summaries))
    assert all(s.success for s in summaries)
    assert len(frames) == sum(s.length + 1 for s in summaries)
    assert all(f.shape == (120, 160, 3) and f.dtype == np.uint8 for f in frames)
    banner = video.banner_height(120)
    assert tinted(frames[0][:banner], video.SUCCESS_COLOR) > 10  # "episode 1/2: success"
    assert not np.array_equal(frames[0][banner:], frames[1][banner:])  # a bit flipped

    summaries = []
    always_bit_0 = lambda obs, goal: np.array([[0]])  # noqa: E731  flips bit 0 back and forth
    frames = list(video.episode_frames(render_env, always_bit_0, 1, 1, summaries))
    assert not summaries[0].success and len(frames) == 6 + 1
    assert tinted(frames[-1][:banner], video.FAILURE_COLOR) > 10
    assert tinted(frames[-1][:banner], video.SUCCESS_COLOR) == 0
    render_env.close()


def test_predator_prey_is_drawn_from_above():
    render_env = video.RenderEnv(EnvConfig("PredatorPrey-v0", {"dims": 2, "horizon": 5}), 128, 128)
    summaries = []
    frames = list(video.episode_frames(render_env, lambda o, g: np.zeros((1, 2), np.float32), 1, 0, summaries))
    assert len(frames) == summaries[0].length + 1 and frames[0].shape == (128, 128, 3)
    assert near(frames[0], (90, 150, 255), 10).sum() > 5  # the predator
    assert near(frames[0], video.FAILURE_COLOR, 10).sum() > 5  # the prey and its circle
    render_env.close()


class NoPictureEnv(BitFlippingEnv):
    metadata = {"render_modes": []}


def test_an_env_that_cannot_draw_is_refused_by_name():
    gym.register("NoPicture-v0", entry_point=NoPictureEnv)
    try:
        with pytest.raises(video.VideoError, match="NoPicture-v0 cannot render frames.*'rgb_array' render mode"):
            video.RenderEnv(EnvConfig("NoPicture-v0"), 64, 64)
    finally:
        del gym.registry["NoPicture-v0"]


# -- writers -----------------------------------------------------------------------------------


def test_mp4_holds_every_frame_at_its_size_and_rate(tmp_path):
    import imageio_ffmpeg

    frames = [np.full((48, 64, 3), 8 * i, np.uint8) for i in range(20)]
    assert video.write_video(tmp_path / "v.mp4", iter(frames), 12) == 20
    reader = imageio_ffmpeg.read_frames(str(tmp_path / "v.mp4"))
    meta = next(reader)
    assert meta["size"] == (64, 48) and meta["fps"] == 12
    assert sum(1 for _ in reader) == 20
    assert [p.name for p in tmp_path.iterdir()] == ["v.mp4"]  # no temporary file left


def test_a_missing_mp4_encoder_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # import fails
    with pytest.raises(video.VideoError, match=r"pip install imageio-ffmpeg.*\.gif"):
        video.check_encoder("mp4")
    video.check_encoder("gif")  # Pillow only


# -- python -m her_mpi.evaluate --video --------------------------------------------------------


@pytest.fixture(scope="module")
def fetch_reach_policy(tmp_path_factory):
    return exported_policy(tmp_path_factory, "fetch_reach")


def evaluate(*args, env=None):
    """The CLI choosing its OpenGL backend itself, unless ``env`` sets one."""
    environ = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM")}
    return subprocess.run([sys.executable, "-m", "her_mpi.evaluate", *map(str, args)], capture_output=True,
                          text=True, timeout=300, env={**environ, **(env or {})})


def test_two_episode_gif_of_an_exported_fetch_reach_policy(fetch_reach_policy, tmp_path):
    out = tmp_path / "episodes.gif"
    result = evaluate("--policy", fetch_reach_policy, "--video", out, "--episodes", 2, "--width", 96,
                      "--height", 64, "--fps", 10)
    assert result.returncode == 0, describe(result)
    summary = json.loads(result.stdout)
    horizon = 50  # FetchReach: the reset frame and one per step
    assert summary["episodes"] == 2 and summary["frames"] == 2 * (horizon + 1)
    gif = Image.open(out)
    assert gif.n_frames == 2 * (horizon + 1) and gif.size == (96, 64)
    assert gif.info["duration"] == 100 and gif.info.get("loop") == 0
    first = np.asarray(gif.convert("RGB"))
    banner = video.banner_height(64)
    assert tinted(first[:banner], video.SUCCESS_COLOR) + tinted(first[:banner], video.FAILURE_COLOR) > 5


def test_mp4_of_an_exported_policy_at_the_envs_rate(fetch_reach_policy, tmp_path):
    import imageio_ffmpeg

    out = tmp_path / "one.mp4"
    result = evaluate("--policy", fetch_reach_policy, "--video", out, "--episodes", 1, "--width", 64, "--height", 48)
    assert result.returncode == 0, describe(result)
    assert json.loads(result.stdout)["fps"] == 25  # FetchReach's control period is 40 ms
    reader = imageio_ffmpeg.read_frames(str(out))
    meta = next(reader)
    assert meta["size"] == (64, 48) and meta["fps"] == 25 and sum(1 for _ in reader) == 51


@pytest.mark.parametrize("args, env, message", [
    (["--video", "{dir}/v.avi"], {}, "expected a name ending in .mp4 or .gif, got '.avi'"),
    (["--video", "{dir}/v.mp4", "--width", "101"], {}, "needs an even width, got 101"),
    (["--video", "{dir}/v.gif", "--fps", "0"], {}, "--fps must be in"),
    (["--video", "{dir}/v.gif"], {"MUJOCO_GL": "glx"}, "MUJOCO_GL='glx' cannot render offscreen"),
    # an EGL that cannot load (PyOpenGL bound to another platform): what was tried, what to install
    (["--video", "{dir}/v.gif"], {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "osmesa"},
     "cannot render FetchReach-v4 offscreen with MUJOCO_GL=egl.*apt-get install libegl1"),
])
def test_video_mistakes_are_clear_errors(fetch_reach_policy, tmp_path, args, env, message):
    result = evaluate("--policy", fetch_reach_policy, "--episodes", 1,
                      *[a.format(dir=tmp_path) for a in args], env=env)
    assert result.returncode == 2, describe(result)
    assert "her_mpi.evaluate: error:" in result.stderr
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr
    assert re.search(message, result.stderr), result.stderr
    assert not list(tmp_path.iterdir())  # nothing written


# -- log.video_every during training (np=2) ----------------------------------------------------


VIDEO_SETTINGS = ["--set", "log.video_every=2", "--set", "log.video_format=gif",
                  "--set", "log.video_width=64", "--set", "log.video_height=48"]
# Three epochs: the video of epoch 2 is followed by an epoch of training it must not disturb.
THREE_EPOCHS = [*TINY, "--set", "log.tensorboard=true", "--set", "train.n_epochs=3"]


@pytest.fixture(scope="module")
def video_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("video") / "run"
    result = run_mpi(2, ["-m", "her_mpi.train", "--run-dir", run_dir, *THREE_EPOCHS, *VIDEO_SETTINGS])
    assert result.returncode == 0, describe(result)
    return run_dir, result


@pytest.mark.mpi
def test_training_writes_a_video_every_n_epochs_and_to_tensorboard(video_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, result = video_run
    assert sorted(p.name for p in (run_dir / "videos").iterdir()) == ["epoch_0002.gif"]  # not epochs 1 and 3
    path = run_dir / "videos" / "epoch_0002.gif"
    gif = Image.open(path)
    assert gif.n_frames == 2 * 51 and gif.size == (64, 48)  # log.video_episodes = 2 by default
    assert f"video of epoch 2: {path} (102 frames" in result.stdout
    accumulator = EventAccumulator(str(run_dir / "tb"), size_guidance={"images": 0})
    accumulator.Reload()
    assert video.TrainingVideos.TAG in accumulator.Tags()["images"]
    events = accumulator.Images(video.TrainingVideos.TAG)
    assert len(events) == 1
    assert events[0].step == int(read_progress(run_dir)[1]["env_steps"])
    assert (events[0].width, events[0].height) == (64, 48)
    assert events[0].encoded_image_string == path.read_bytes()  # an animated GIF, as add_video writes


@pytest.mark.mpi
def test_videos_move_no_training_stream(video_run, tmp_path):
    """The same run without videos ends with bit-identical networks, optimizers and RNG states."""
    run_dir, _ = video_run
    plain = tmp_path / "plain"
    result = run_mpi(2, ["-m", "her_mpi.train", "--run-dir", plain, *THREE_EPOCHS])
    assert result.returncode == 0, describe(result)
    assert not (plain / "videos").exists()
    with_video = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)
    without = torch.load(plain / "checkpoints" / "latest.pt", weights_only=False)

    def leaves(node, prefix=""):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from leaves(value, f"{prefix}.{key}")
        elif isinstance(node, (list, tuple)):
            for index, value in enumerate(node):
                yield from leaves(value, f"{prefix}[{index}]")
        else:
            yield prefix, node

    # Everything but the config (it holds the video settings) and the wall-clock time: networks,
    # optimizers, counters and every rank's random streams.
    ignored = {"config", "time_s"}
    a = dict(leaves({k: v for k, v in with_video.items() if k not in ignored}))
    b = dict(leaves({k: v for k, v in without.items() if k not in ignored}))
    assert a.keys() == b.keys()
    assert any("rng" in key for key in a), sorted(a)[:20]  # the random streams are compared
    for key in a:
        same = torch.equal(a[key], b[key]) if isinstance(a[key], torch.Tensor) else \
            np.array_equal(np.asarray(a[key]), np.asarray(b[key]))
        assert same, f"{key} differs when videos are recorded"


def test_ms_pacman_outlines_its_goal_cell_itself():
    from her_mpi.envs.ms_pacman import COL_EDGES, ROW_EDGES

    render_env = video.RenderEnv(EnvConfig("MsPacmanGoal-v0"), 160, 210)  # the emulator's own size
    try:
        frame = np.asarray(render_env.frame())
        row, col = (int(v) for v in render_env.env.unwrapped.goal)
        cyan = (frame == [0, 255, 255]).all(-1)
        assert cyan[ROW_EDGES[row], COL_EDGES[col]:COL_EDGES[col + 1]].all()  # the cell's top edge
        assert cyan.sum() == 2 * (COL_EDGES[col + 1] - COL_EDGES[col]) + 2 * (ROW_EDGES[row + 1] - ROW_EDGES[row]) - 4
    finally:
        render_env.close()
