"""Goal-conditioned Ms. Pac-Man (HTRPO's Table 1), on the Arcade Learning Environment (ale-py,
whose wheel ships the ROM).

Each step repeats one of UP, RIGHT, LEFT, DOWN for 13 emulator frames. Every 4th of those frames
(frames 0, 4, 8, 12 of the step) the maximum of that frame and the one before it (Atari sprites
flicker) is cropped to rows 2-170 and columns 2-158 (the maze; no score), resized to 84x84 grey
and pushed onto a stack of the last 4: the observation is that 4x84x84 uint8 stack. (Grey comes
from ALE's own grey palette, a luminance like the authors' RGB weighting.)

The maze is overlaid by a 14x19 grid (row bands of 12 pixels from y = 0 to 168, column edges
10, 20, 28, ..., 76, 80, 88, ..., 144 and the screen's edge, on the raw 210x160 frame); the
achieved goal is the (row, column) cell holding the most Ms. Pac-Man pixels (grey value in
(160, 170)) of the step's last raw frame, or the previous cell when she is not drawn. Desired
goals are drawn uniformly from the reachable cells (:data:`REACHABLE`) other than the start
cell. Reward is -1 until the achieved cell equals the goal (0 there, which ends the episode);
losing a life ends the episode too (as a failure), and so do 26 steps.

Reset: the game is reset and 240 frames are skipped (nothing moves in them; actions do not
count), so every episode starts from the same maze with Ms. Pac-Man at cell (8, 10); the goal
is what varies.
"""

from __future__ import annotations

from collections import deque

import gymnasium as gym
import numpy as np

from her_mpi.envs.exact_goal import ExactGoal

FRAMESKIP = 13
STACK = 4
STACK_EVERY = 4  # raw frames between stacked frames within a step
RESET_SKIP_FRAMES = 240
HORIZON = 26
CROP_ROWS, CROP_COLS = (2, 170), (2, 158)
FRAME_SIZE = 84
ROW_EDGES = np.arange(0, 169, 12)  # 14 bands
COL_EDGES = np.array([0, 10, 20, 28, 36, 44, 52, 60, 68, 76, 80, 88, 96, 104, 112, 120, 128, 136, 144, 159])
GRID = (len(ROW_EDGES) - 1, len(COL_EDGES) - 1)  # (14, 19)
PACMAN_GREY = (160, 170)  # exclusive bounds of Ms. Pac-Man's grey value
ACTION_NAMES = ("UP", "RIGHT", "LEFT", "DOWN")
PLAYER_RAM = (10, 16)  # RAM bytes holding Ms. Pac-Man's x and y (used to tell positions apart)

# The cells Ms. Pac-Man can occupy, as the detector reports them ("1"), rows top to bottom.
# Derived by derive_reachable_cells(): a breadth-first search over her positions from the
# post-reset state (cloneState/restoreState; each edge one 13-frame action; states where a life
# is lost are dropped), marking the detector's cell at every state reached: 163 cells. Recompute
# with `python -m her_mpi.envs.ms_pacman` (about a minute); tests check the two agree.
REACHABLE_ROWS = (
    "1111011111111101111",
    "1101010000000101001",
    "1111111111111111111",
    "0101001000001001010",
    "1101111111111111011",
    "0100001000001000010",
    "0111111000001111110",
    "0100001000001000010",
    "1101111111111111011",
    "0101010100010101010",
    "1111010111110101111",
    "1101011100011101001",
    "1101000100010001001",
    "1111111111111111111",
)
REACHABLE = np.array([[c == "1" for c in row] for row in REACHABLE_ROWS])


def pacman_cell(frame: np.ndarray) -> tuple[int, int] | None:
    """The grid cell with the most Ms. Pac-Man pixels in a raw 210x160 grey frame (None: none)."""
    frame = np.asarray(frame)
    if frame.ndim != 2 or frame.shape[0] < ROW_EDGES[-1] or frame.shape[1] < COL_EDGES[-1]:
        raise ValueError(f"expected a raw grey frame of at least {ROW_EDGES[-1]}x{COL_EDGES[-1]} pixels, "
                         f"got shape {frame.shape}")
    region = frame[: ROW_EDGES[-1], : COL_EDGES[-1]]
    pixels = ((region > PACMAN_GREY[0]) & (region < PACMAN_GREY[1])).astype(np.int32)
    counts = np.add.reduceat(np.add.reduceat(pixels, ROW_EDGES[:-1], axis=0), COL_EDGES[:-1], axis=1)
    if counts.max() == 0:
        return None
    row, col = np.unravel_index(int(counts.argmax()), counts.shape)
    return int(row), int(col)


def downsample(frame: np.ndarray) -> np.ndarray:
    """Crop the maze and resize to 84x84 (bilinear), uint8."""
    from PIL import Image

    crop = frame[CROP_ROWS[0]: CROP_ROWS[1], CROP_COLS[0]: CROP_COLS[1]]
    return np.asarray(Image.fromarray(crop).resize((FRAME_SIZE, FRAME_SIZE), Image.BILINEAR), np.uint8)


def make_ale(seed: int = 0):
    from ale_py import Action, ALEInterface, LoggerMode, roms

    ALEInterface.setLoggerMode(LoggerMode.Error)
    ale = ALEInterface()
    ale.setInt("random_seed", int(seed) % (2 ** 31))
    ale.setFloat("repeat_action_probability", 0.0)  # deterministic emulator: goals carry the variety
    ale.loadROM(roms.get_rom_path("ms_pacman"))
    actions = tuple(getattr(Action, name) for name in ACTION_NAMES)
    return ale, actions, Action.NOOP


class MsPacmanGoalEnv(ExactGoal, gym.Env):
    metadata = {"render_modes": ["rgb_array"]}
    timeout_reward = 0.0

    def __init__(self, goal_cells: list | None = None, render_mode: str | None = None):
        """``goal_cells``: draw desired goals from these (row, column) cells only (each must be
        reachable), e.g. for a short test or a curriculum; default: every reachable cell."""
        self.render_mode = render_mode
        self.horizon, self.dt = HORIZON, FRAMESKIP / 60.0
        image = gym.spaces.Box(0, 255, (STACK, FRAME_SIZE, FRAME_SIZE), np.uint8)
        cell = gym.spaces.Box(0.0, np.array(GRID, np.float32) - 1, (2,), np.float32)
        self.observation_space = gym.spaces.Dict(observation=image, achieved_goal=cell, desired_goal=cell)
        self.action_space = gym.spaces.Discrete(len(ACTION_NAMES))
        self.valid_goals = np.argwhere(REACHABLE).astype(np.float32)
        if goal_cells is not None:
            cells = np.asarray(goal_cells)
            if cells.ndim != 2 or cells.shape[1] != 2 or len(cells) == 0:
                raise ValueError(f"MsPacmanGoal-v0: goal_cells must be a non-empty list of [row, column] "
                                 f"pairs, got {goal_cells!r}")
            for row, col in cells:
                if not (0 <= row < GRID[0] and 0 <= col < GRID[1] and REACHABLE[int(row), int(col)]):
                    raise ValueError(f"MsPacmanGoal-v0: goal cell [{row}, {col}] is not a reachable cell "
                                     f"of the {GRID[0]}x{GRID[1]} grid (see REACHABLE in her_mpi/envs/ms_pacman.py)")
            self.valid_goals = cells.astype(np.float32)
        self.ale, self.ale_actions, self.noop = make_ale(0)
        self.stack: deque = deque(maxlen=STACK)
        self.cell = (8, 10)
        self.goal = np.zeros(2, np.float32)
        self.steps = 0

    def _obs(self) -> dict:
        return {"observation": np.stack(self.stack), "achieved_goal": np.array(self.cell, np.float32),
                "desired_goal": self.goal.copy()}

    def _detect(self) -> None:
        cell = pacman_cell(self.ale.getScreenGrayscale())
        if cell is not None:  # not drawn (e.g. while dying): she has not moved
            self.cell = cell

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)  # the goal stream; the emulator itself is deterministic here
        self.ale.reset_game()
        for _ in range(RESET_SKIP_FRAMES):
            self.ale.act(self.noop)
        frame = self.ale.getScreenGrayscale()
        self.stack.clear()
        for _ in range(STACK - 1):
            self.stack.append(np.zeros((FRAME_SIZE, FRAME_SIZE), np.uint8))
        self.stack.append(downsample(frame))
        self.previous = frame
        self._detect()
        start = np.array(self.cell, np.float32)
        choices = self.valid_goals[np.any(self.valid_goals != start, axis=1)]
        choices = choices if len(choices) else self.valid_goals  # only the start cell was allowed
        self.goal = choices[self.np_random.integers(len(choices))]
        self.steps = 0
        return self._obs(), {"is_success": 0.0}

    def step(self, action):
        index = int(np.asarray(action).reshape(()))
        if not 0 <= index < len(self.ale_actions):
            raise ValueError(f"MsPacmanGoal-v0: action must be an integer in [0, {len(self.ale_actions)}) "
                             f"({', '.join(ACTION_NAMES)}), got {action!r}")
        lives = self.ale.lives()
        for frame_index in range(FRAMESKIP):
            self.ale.act(self.ale_actions[index])
            frame = self.ale.getScreenGrayscale()
            if frame_index % STACK_EVERY == 0:
                self.stack.append(downsample(np.maximum(frame, self.previous)))
            self.previous = frame
        self.steps += 1
        self._detect()
        success = bool(np.array_equal(np.array(self.cell, np.float32), self.goal))
        life_lost = self.ale.lives() < lives or self.ale.game_over()
        terminated = success or life_lost
        truncated = self.steps >= self.horizon and not terminated
        return self._obs(), 0.0 if success else -1.0, terminated, truncated, {"is_success": float(success)}

    def render(self) -> np.ndarray:
        """The emulator's screen with the goal cell outlined in cyan."""
        screen = self.ale.getScreenRGB().copy()
        row, col = int(self.goal[0]), int(self.goal[1])
        top, bottom, left, right = ROW_EDGES[row], ROW_EDGES[row + 1] - 1, COL_EDGES[col], COL_EDGES[col + 1] - 1
        cyan = np.array([0, 255, 255], np.uint8)
        screen[top, left:right + 1] = screen[bottom, left:right + 1] = cyan
        screen[top:bottom + 1, left] = screen[top:bottom + 1, right] = cyan
        return screen


def derive_reachable_cells() -> np.ndarray:
    """The [14, 19] mask of cells the detector reports at any state reached from the post-reset
    state without losing a life (what :data:`REACHABLE` holds)."""
    return cell_distances() >= 0


def cell_distances() -> np.ndarray:
    """Breadth-first search over Ms. Pac-Man's positions from the post-reset state: for each cell
    of the [14, 19] grid, the fewest env steps (13-frame actions) after which the detector reports
    it without a life lost; -1 where it never does. Positions, not whole emulator states, are
    searched (the ghosts are ignored), so a distance is what a ghost-free path takes."""
    ale, actions, noop = make_ale(0)
    ale.reset_game()
    for _ in range(RESET_SKIP_FRAMES):
        ale.act(noop)
    lives = ale.lives()
    distance = np.full(GRID, -1, np.int64)
    distance[pacman_cell(ale.getScreenGrayscale())] = 0
    # The start position is not marked seen: she does not move in the first step's frames (the
    # game is still starting), so the state after it must be explored although she is where she was.
    seen: set = set()
    queue = deque([(ale.cloneState(), 0)])
    while queue:
        state, depth = queue.popleft()
        for action in actions:
            ale.restoreState(state)
            for _ in range(FRAMESKIP):
                ale.act(action)
                if ale.lives() < lives:
                    break
            if ale.lives() < lives:
                continue
            cell = pacman_cell(ale.getScreenGrayscale())
            if cell is not None and distance[cell] < 0:
                distance[cell] = depth + 1
            position = tuple(int(ale.getRAM()[i]) for i in PLAYER_RAM)
            if position not in seen:
                seen.add(position)
                queue.append((ale.cloneState(), depth + 1))
    return distance


if __name__ == "__main__":
    derived = derive_reachable_cells()
    for row in derived:
        print('    "' + "".join("1" if c else "0" for c in row) + '",')
    print(f"{int(derived.sum())} reachable cells; matches REACHABLE: {bool(np.array_equal(derived, REACHABLE))}")
