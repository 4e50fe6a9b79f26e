"""Videos of a policy's test episodes: offscreen frames with the goal marked and each episode's
result written on them, saved as MP4 (imageio-ffmpeg) or GIF (Pillow), and as an animated GIF
in TensorBoard.

Used by ``python -m her_mpi.evaluate --video FILE`` and by training (``log.video_every``).

* MuJoCo envs (Fetch, Hand, discrete Fetch) render offscreen through gymnasium's renderer, which
  reads ``MUJOCO_GL`` when it creates its OpenGL context: :func:`select_gl_backend` keeps a value
  the user set and picks ``egl`` when there is no display. Their goal sites (``target0``,
  ``target1``, ...) are drawn by the env itself but are small and often hidden behind the arm
  (FetchPush, PickAndPlace): each is also circled in its own colour, projected with the camera
  the frame was rendered with, so the goal is visible in every frame.
* Ms. Pac-Man renders the emulator screen; the goal cell is outlined.
* BitFlipping and PredatorPrey have no renderer of their own: their state is drawn with Pillow
  (bits against goal bits; the arena from above with the prey's interception circle).

Every frame carries a banner: ``episode 2/5: success`` (or ``failure``, known once the episode
ended, so frames are buffered one episode at a time) and ``step t/T``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes.util
import gc
import inspect
import io
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from her_mpi.envs.drawing import FAILURE_COLOR, SUCCESS_COLOR, banner_height, caption_font  # noqa: F401
from her_mpi.config import ConfigError, EnvConfig

VIDEO_FORMATS = ("mp4", "gif")
GL_BACKENDS = ("egl", "osmesa", "glfw")  # the values gymnasium's MuJoCo renderer accepts
MIN_SIZE, MAX_SIZE = 16, 4096
# The video episodes' seed stream: entropy of its own, so it never equals a training stream
# (those are SeedSequence(seed, spawn_key=(rank,)) and their children).
VIDEO_STREAM_TAG = 0x766964656F  # "video"

Policy = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (obs [1, od], g [1, gd]) -> env-unit action


class VideoError(ConfigError):
    """A video cannot be made here: no OpenGL backend, no encoder, an env that cannot draw, a bad
    file name or size. Reported like a config mistake (message, exit status 2)."""


# ---------------------------------------------------------------------------------------------
# Checks that can fail before anything is rendered
# ---------------------------------------------------------------------------------------------


def select_gl_backend(environ: dict | None = None) -> str:
    """Choose MuJoCo's OpenGL backend for offscreen frames; returns what was chosen, for messages.

    An explicit ``MUJOCO_GL`` is kept (and checked). Without one and without a display, ``egl``
    is chosen (headless: a GPU driver or Mesa). With a display it stays unset and gymnasium tries
    glfw, egl and osmesa in turn. Call it before the first frame is rendered (best: before mujoco
    is imported, which also reads the variable)."""
    environ = os.environ if environ is None else environ
    explicit = environ.get("MUJOCO_GL")
    if explicit is not None:
        if explicit not in GL_BACKENDS:
            raise VideoError(f"MUJOCO_GL={explicit!r} cannot render offscreen frames; expected one of "
                             f"{', '.join(GL_BACKENDS)} (or leave it unset to choose automatically)")
        return f"MUJOCO_GL={explicit} (set in the environment)"
    if environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY"):
        return "glfw (a display is set and MUJOCO_GL is not; gymnasium tries egl, then osmesa, if glfw cannot start)"
    environ["MUJOCO_GL"] = "egl"
    return "MUJOCO_GL=egl (chosen because there is no display)"


def gl_error(what: str, backend: str, exc: BaseException) -> VideoError:
    reason = f"{type(exc).__name__}: {str(exc).strip().rstrip('.')}"
    library = {"egl": "EGL", "osmesa": "OSMesa"}.get(os.environ.get("MUJOCO_GL", ""))
    if library and ctypes.util.find_library(library) is None:
        reason = f"no lib{library} is installed ({reason})"
    display = os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    unusable_display = (f" If the display ({display}) is not usable here (e.g. over ssh), set MUJOCO_GL=egl."
                        if display and "MUJOCO_GL" not in os.environ else "")
    return VideoError(
        f"cannot {what} with {backend}: {reason}. Install an OpenGL backend: EGL "
        "(`apt-get install libegl1 libgl1-mesa-dri`, or a GPU driver) for MUJOCO_GL=egl, or OSMesa "
        "(`apt-get install libosmesa6`) with MUJOCO_GL=osmesa; with a display (or under xvfb-run) "
        f"MUJOCO_GL=glfw works too.{unusable_display}")


@contextlib.contextmanager
def unraisable_silenced():
    """Half-built OpenGL objects of a failed context creation complain in ``__del__``
    ("Exception ignored in ...") when collected; the error they belong to is reported already."""
    hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: None
    try:
        yield
    finally:
        sys.unraisablehook = hook


def video_format(path: str | Path) -> str:
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in VIDEO_FORMATS:
        raise VideoError(f"video file {str(path)!r}: expected a name ending in "
                         f"{' or '.join('.' + f for f in VIDEO_FORMATS)}, got {Path(path).suffix or 'no suffix'!r}")
    return suffix


def check_frame_size(width: int, height: int, fmt: str, what: str = "frame size") -> None:
    for name, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, int) or not MIN_SIZE <= value <= MAX_SIZE:
            raise VideoError(f"{what}: {name} must be an integer in [{MIN_SIZE}, {MAX_SIZE}] pixels, got {value!r}")
        if fmt == "mp4" and value % 2:
            raise VideoError(f"{what}: MP4 (H.264, yuv420p) needs an even {name}, got {value}")


def check_encoder(fmt: str) -> None:
    """Fail now, not after rendering, if the file cannot be written."""
    if fmt == "gif":
        return
    try:
        import imageio_ffmpeg

        imageio_ffmpeg.get_ffmpeg_exe()
    except (ImportError, RuntimeError) as exc:
        raise VideoError(f"writing .mp4 needs ffmpeg through the imageio-ffmpeg package ({exc}); "
                         "`pip install imageio-ffmpeg`, or write a .gif (Pillow only)") from None


def natural_fps(spec) -> int:
    """Real time for envs with a control period (Fetch 25), else 4 steps a second."""
    return max(1, round(1.0 / spec.control_period)) if spec.control_period > 0 else 4


# ---------------------------------------------------------------------------------------------
# One env that renders marked frames
# ---------------------------------------------------------------------------------------------


class RenderEnv:
    """An env instance of its own that renders ``width`` x ``height`` RGB frames with the goal
    marked (see the module docstring). Construction renders a first frame, so a missing OpenGL
    backend is a :class:`VideoError` here rather than a traceback later."""

    def __init__(self, env_cfg: EnvConfig, width: int, height: int, backend: str = ""):
        import gymnasium as gym
        from gymnasium.envs.registration import load_env_creator

        from her_mpi.envs import env_spec, make_env, register_envs

        check_frame_size(width, height, "gif")
        self.width, self.height = width, height
        backend = backend or f"MUJOCO_GL={os.environ.get('MUJOCO_GL', '(unset)')}"
        try:
            import mujoco  # noqa: F401  (loads the OpenGL bindings MUJOCO_GL names; the envs need it)
        except Exception as exc:
            raise gl_error("load MuJoCo's OpenGL bindings", backend, exc) from None
        register_envs()
        if env_cfg.id not in gym.registry:
            make_env(env_cfg)  # raises the usual "unknown environment ... did you mean" error
        entry_point = gym.spec(env_cfg.id).entry_point
        creator = entry_point if callable(entry_point) else load_env_creator(entry_point)
        modes = (getattr(creator, "metadata", None) or {}).get("render_modes", [])
        if "rgb_array" not in modes:
            raise VideoError(f"{env_cfg.id} cannot render frames (its render modes: {modes or 'none'}); videos "
                             f"need an env with an 'rgb_array' render mode")
        extra = {"render_mode": "rgb_array"}
        if accepts_size(creator):
            extra.update(width=width, height=height)
        self.env = make_env(EnvConfig(env_cfg.id, {**env_cfg.kwargs, **extra}, env_cfg.max_episode_steps))
        self.env_id = env_cfg.id
        self.spec = env_spec(self.env, env_cfg.id)
        self.mujoco_env = mujoco_env_of(self.env.unwrapped)
        self.target_sites = target_sites(self.mujoco_env) if self.mujoco_env is not None else []
        self._closed = False
        atexit.register(self.close)  # an OpenGL context left to the interpreter's teardown complains
        self.env.reset(seed=0)
        try:
            self.frame()
        except VideoError:
            self.close()
            raise
        except Exception as exc:  # whatever the GL stack raises: EGL/OSMesa/GLFW errors, ImportError
            error = gl_error(f"render {env_cfg.id} offscreen", backend, exc)
            with unraisable_silenced():
                exc.__traceback__ = None  # its frames hold the half-built context: collect it now
                self.close()
                gc.collect()
            raise error from None

    def frame(self):
        """The current state as a PIL RGB image of the requested size, goal marked."""
        from PIL import Image

        viewer = self.mujoco_env.mujoco_renderer.viewer if self.mujoco_env is not None else None
        if viewer is not None:  # another env's context may be current (gymnasium does not switch)
            viewer.make_context_current()
        rgb = np.asarray(self.env.render())
        image = Image.fromarray(np.ascontiguousarray(rgb[..., :3]).astype(np.uint8))
        native = image.size
        pixel_art = self.mujoco_env is None  # emulator screens: keep the pixels sharp
        if native != (self.width, self.height):
            image = image.resize((self.width, self.height), Image.NEAREST if pixel_art else Image.BILINEAR)
        scale = (self.width / native[0], self.height / native[1])
        if self.target_sites:
            draw_target_rings(image, self.mujoco_env, self.target_sites, native, scale)
        return image

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        viewer = self.mujoco_env.mujoco_renderer.viewer if self.mujoco_env is not None else None
        if viewer is not None:
            # gymnasium frees the OpenGL context but leaves MuJoCo's render context to the garbage
            # collector, which then deletes its buffers in whatever context is current by then:
            # the next env's frames came out black. Free it here, in its own context.
            viewer.make_context_current()
            viewer.con.free()
        self.env.close()


def accepts_size(creator) -> bool:
    try:
        parameters = inspect.signature(creator).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is p.VAR_KEYWORD or p.name in ("width", "height") for p in parameters)


def mujoco_env_of(unwrapped):
    """The gymnasium-robotics MuJoCo env inside ``unwrapped`` (itself, or a wrapper's ``inner``)."""
    for candidate in (unwrapped, getattr(unwrapped, "inner", None)):
        if candidate is not None and hasattr(candidate, "mujoco_renderer") and hasattr(candidate, "model"):
            return candidate
    return None


def target_sites(env) -> list[tuple[int, tuple[int, int, int]]]:
    """(site id, RGB colour) of the goal sites gymnasium-robotics moves to the goal: target0, ..."""
    import mujoco

    sites = []
    for index in range(16):
        site = mujoco.mj_name2id(env.model, mujoco.mjtObj.mjOBJ_SITE, f"target{index}")
        if site < 0:
            break
        rgba = env.model.site_rgba[site]
        sites.append((site, tuple(int(round(255 * c)) for c in rgba[:3])))
    return sites


def project_points(env, points: np.ndarray, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Pixel (x, y) of world ``points`` [n, 3] in the last frame rendered and their depth along the
    view (> 0: in front). MuJoCo renders a mono frame with the average of the scene's two eye
    cameras and widens the frustum to the viewport's aspect ratio; gymnasium flips rows so row 0
    is the top."""
    import mujoco

    viewer = env.mujoco_renderer.viewer
    camera = mujoco.mjv_averageCamera(viewer.scn.camera[0], viewer.scn.camera[1])
    position, forward, up = np.array(camera.pos), np.array(camera.forward), np.array(camera.up)
    right = np.cross(forward, up)
    offset = np.asarray(points, np.float64) - position
    x, y, depth = offset @ right, offset @ up, offset @ forward
    width, height = size
    frustum_height = camera.frustum_top - camera.frustum_bottom
    half_width = 0.5 * width / height * frustum_height
    with np.errstate(divide="ignore", invalid="ignore"):
        u = (x * camera.frustum_near / depth - (camera.frustum_center - half_width)) / (2 * half_width) * width
        v = (1 - (y * camera.frustum_near / depth - camera.frustum_bottom) / frustum_height) * height
    return np.stack([u, v], -1), depth


def draw_target_rings(image, env, sites, native: tuple[int, int], scale: tuple[float, float]) -> None:
    from PIL import ImageDraw

    pixels, depth = project_points(env, env.data.site_xpos[[s for s, _ in sites]], native)
    draw = ImageDraw.Draw(image)
    radius = max(5.0, 0.025 * min(image.size))
    line = max(2, round(radius / 5))
    for (u, v), z, (_, color) in zip(pixels, depth, sites):
        if not (z > 0 and np.isfinite(u) and np.isfinite(v)):
            continue
        x, y = u * scale[0], v * scale[1]
        box = [x - radius, y - radius, x + radius, y + radius]
        draw.ellipse([c - line if i < 2 else c + line for i, c in enumerate(box)], outline=(255, 255, 255), width=line)
        draw.ellipse(box, outline=color, width=line)


# ---------------------------------------------------------------------------------------------
# Episodes -> captioned frames
# ---------------------------------------------------------------------------------------------


def caption(image, left: str, left_color, right: str):
    from PIL import ImageDraw

    height = banner_height(image.height)
    draw = ImageDraw.Draw(image)
    draw.rectangle([0, 0, image.width, height], fill=(0, 0, 0))
    font = caption_font(max(8, int(height * 0.7)))
    draw.text((4, height / 2), left, fill=left_color, font=font, anchor="lm")
    draw.text((image.width - 4, height / 2), right, fill=(235, 235, 235), font=font, anchor="rm")
    return image


@dataclass
class EpisodeSummary:
    success: bool
    length: int
    episode_return: float


def episode_frames(render_env: RenderEnv, policy: Policy, n_episodes: int, seed: int,
                   summaries: list[EpisodeSummary]) -> Iterator[np.ndarray]:
    """Run ``n_episodes`` episodes with ``policy`` (env units, deterministic) and yield their
    captioned frames (the reset state, then one per step), episode by episode; each finished
    episode's summary is appended to ``summaries``. The first reset uses ``seed``, so the same
    seed shows the same goals."""
    env, spec = render_env.env, render_env.spec
    for episode in range(n_episodes):
        o, _ = env.reset(seed=seed if episode == 0 else None)
        frames = [render_env.frame()]
        success, episode_return, length = False, 0.0, spec.horizon
        for t in range(spec.horizon):
            obs = np.ravel(o["observation"]).astype(spec.obs_dtype)[None]
            goal = np.asarray(o["desired_goal"], np.float32).reshape(1, -1)
            action = np.asarray(policy(obs, goal))
            action = int(action.reshape(-1)[0]) if spec.discrete else action.astype(np.float32).reshape(spec.action_dim)
            o, reward, terminated, truncated, info = env.step(action)
            episode_return += float(reward)
            success = bool(info.get("is_success", 0.0))
            frames.append(render_env.frame())
            if terminated or truncated:
                length = t + 1
                break
        summaries.append(EpisodeSummary(success, length, episode_return))
        text = f"episode {episode + 1}/{n_episodes}: {'success' if success else 'failure'}"
        color = SUCCESS_COLOR if success else FAILURE_COLOR
        for step, image in enumerate(frames):
            yield np.asarray(caption(image, text, color, f"step {step}/{spec.horizon}"))


# ---------------------------------------------------------------------------------------------
# Writers
# ---------------------------------------------------------------------------------------------


def write_video(path: str | Path, frames: Iterator[np.ndarray], fps: float) -> int:
    """Write ``frames`` (RGB uint8, all one size) to ``path`` (.mp4 or .gif) atomically; returns
    the number of frames. Frames are consumed as they come (an MP4 never holds them all)."""
    path = Path(path)
    fmt = video_format(path)
    check_encoder(fmt)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        count = (write_mp4 if fmt == "mp4" else write_gif)(tmp, frames, fps)
        if count == 0:
            raise VideoError(f"video {str(path)!r}: no frames to write")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return count


def write_mp4(target: str, frames: Iterator[np.ndarray], fps: float) -> int:
    import imageio_ffmpeg

    writer, count = None, 0
    try:
        for frame in frames:
            if writer is None:
                height, width = frame.shape[:2]
                check_frame_size(width, height, "mp4")
                writer = imageio_ffmpeg.write_frames(target, (width, height), fps=fps, codec="libx264",
                                                     macro_block_size=1, ffmpeg_log_level="error",
                                                     output_params=["-f", "mp4"])
                writer.send(None)
            writer.send(np.ascontiguousarray(frame, np.uint8))
            count += 1
    finally:
        if writer is not None:
            writer.close()
    return count


def gif_bytes(frames: Iterator[np.ndarray], fps: float) -> tuple[bytes, int]:
    """An animated GIF of ``frames`` (looping) and its number of frames."""
    from PIL import Image

    # One palette per frame (fast octree: 5x faster than median cut here, as good on these
    # scenes) and no dithering (its noise makes every frame differ and the file grow).
    images = [Image.fromarray(np.asarray(f, np.uint8)).quantize(256, method=Image.Quantize.FASTOCTREE,
                                                                dither=Image.Dither.NONE) for f in frames]
    if not images:
        return b"", 0
    buffer = io.BytesIO()
    images[0].save(buffer, format="GIF", save_all=True, append_images=images[1:],
                   duration=max(20, round(1000 / fps)), loop=0, disposal=1)
    return buffer.getvalue(), len(images)


def write_gif(target: str, frames: Iterator[np.ndarray], fps: float) -> int:
    data, count = gif_bytes(frames, fps)
    with open(target, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return count


def add_tensorboard_video(writer, tag: str, gif: bytes, width: int, height: int, step: int) -> None:
    """The summary ``SummaryWriter.add_video`` writes (an image summary holding an animated GIF,
    shown in TensorBoard's Images tab), encoded with Pillow: ``add_video`` itself needs moviepy's
    ``moviepy.editor``, which moviepy 2 removed, and otherwise only prints a message and writes
    nothing."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=gif)
    writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)
    writer.flush()


# ---------------------------------------------------------------------------------------------
# Training: one video every log.video_every epochs on rank 0
# ---------------------------------------------------------------------------------------------


class TrainingVideos:
    """Rank 0's videos of the agent's deployed (deterministic) policy during training.

    Its env is an instance of its own, reset from a seed stream of its own, and the deterministic
    policy draws no random numbers, so recording moves no stream that training uses; it runs no
    collective (the other ranks simply wait at the next one). Every video shows the same goals,
    so videos of different epochs compare."""

    TAG = "policy_video"

    def __init__(self, config, run_dir: Path):
        log = config.log
        self.every, self.format, self.episodes = log.video_every, log.video_format, log.video_episodes
        check_frame_size(log.video_width, log.video_height, self.format, "log.video_width/video_height")
        check_encoder(self.format)
        backend = select_gl_backend()
        self.render_env = RenderEnv(config.env, log.video_width, log.video_height, backend)
        self.fps = natural_fps(self.render_env.spec)
        self.seed = int(np.random.SeedSequence([config.train.seed, VIDEO_STREAM_TAG]).generate_state(1)[0])
        self.directory = Path(run_dir) / "videos"

    def due(self, epoch: int) -> bool:
        return (epoch + 1) % self.every == 0

    def record(self, agent, epoch: int, env_steps: int, tensorboard=None) -> str:
        """Write ``videos/epoch_NNNN.<format>`` (and the TensorBoard video); returns a log line."""
        import torch

        started = time.perf_counter()
        module = agent.policy()

        def policy(obs, goal):
            with torch.inference_mode():
                return module(torch.from_numpy(obs), torch.from_numpy(goal)).numpy()

        summaries: list[EpisodeSummary] = []
        frames = list(episode_frames(self.render_env, policy, self.episodes, self.seed, summaries))
        path = self.directory / f"epoch_{epoch + 1:04d}.{self.format}"
        write_video(path, iter(frames), self.fps)
        if tensorboard is not None:
            gif = path.read_bytes() if self.format == "gif" else gif_bytes(frames, self.fps)[0]
            add_tensorboard_video(tensorboard, self.TAG, gif, self.render_env.width, self.render_env.height, env_steps)
        successes = sum(s.success for s in summaries)
        return (f"her_mpi: video of epoch {epoch + 1}: {path} ({len(frames)} frames, {successes}/{len(summaries)} "
                f"episodes successful, {time.perf_counter() - started:.1f}s)")

    def close(self) -> None:
        self.render_env.close()
