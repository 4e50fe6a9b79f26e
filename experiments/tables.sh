#!/usr/bin/env bash
# The long result tables (FetchPush, the other robotics tasks, the source papers' rows) as resumable
# sweeps (python -m her_mpi.sweep), one training at a time at np=2 (NP=N sets another; PARALLEL=K runs K of a
# sweep's seeds at once, for single-rank runs that leave a core idle). Run a table again with the same
# command after any interruption: finished runs are skipped, interrupted ones resume from their last
# checkpoint. Then keep the results in the repository:
#     python experiments/collect_sweep.py runs/sweeps/<table> --name <table>
#
#     experiments/tables.sh push            # FetchPush 300k: TD3, SAC, TD3/DDPG+KFAC, DDPG, then td3_fast (3 seeds)
#     experiments/tables.sh push_ablation   # td3_fast's levers one at a time, 5 seeds
#     experiments/tables.sh push_levers     # TD3 + energy prioritization, 2x updates, batch 512
#     experiments/tables.sh push_mrl        # TD3 with mrl's best Fetch settings the package has
#     experiments/tables.sh push_mrl_full   # ... plus LayerNorm networks and 10k random warm-up steps
#     experiments/tables.sh push_td3_diag   # why TD3 fails Push where DDPG learns: TD3 with one of its changes to DDPG undone
#     VARIANTS=delay1 experiments/tables.sh push_td3_diag  # ... only some of the four
#     EPOCHS=60 SEEDS="2 0 1" VARIANTS=delay1 experiments/tables.sh push_td3_diag  # ... trained on to 600k
#     experiments/tables.sh push_sac_diag   # SAC's Push fix: SAC without its 30% random actions
#     experiments/tables.sh other_tasks     # PickAndPlace 600k, Slide 600k (RECIPE=td3), HandReach 500k (HAND_RECIPE=ddpg), 2 seeds
#     experiments/tables.sh htrpo_discrete  # HTRPO FetchReach/PushDiscrete
#     EPOCHS=70 experiments/tables.sh htrpo_push_discrete  # HTRPO FetchPushDiscrete only
#     EPOCHS=60 experiments/tables.sh htrpo_push_discrete_critic_batch  # ... value fit on 8192 rows per step (CRITIC_BATCH), seed 0
#     experiments/tables.sh htrpo_reach_discrete  # HTRPO FetchReachDiscrete, the paper's recipe, 3 seeds
#     experiments/tables.sh htrpo_push      # HTRPO continuous FetchPush, 2M steps
#     experiments/tables.sh ms_pacman       # HTRPO and DQN+HER on MsPacmanGoal, 2M steps
#     experiments/tables.sh ms_pacman_htrpo_levers  # ... HTRPO levers screened on seed 0 to 500k (LEVERS=..., MAX_STEPS=...)
#     MAX_STEPS=2000000 LEVERS=authors_bonus10 SEEDS="0 1 2" experiments/tables.sh ms_pacman_htrpo_levers  # ... the authors_bonus10
#         runs trained on to 2M: the runs of ms_pacman_goal_htrpo_authors (its settings, the same in effect)
#     experiments/tables.sh hpg_screen      # HPG's step size and batch on 8 bits, seed 0; htrpo_vs_hpg: HTRPO vs HPG, seeds 1-3
#     experiments/tables.sh htrpo_reach     # HTRPO on continuous FetchReach, seeds 1-3 (the recipe was tuned on seed 0)
#     experiments/tables.sh htrpo_reach_hold  # ... with copies that run past their first success (algo.hold_goal)
#     experiments/tables.sh htrpo_push_hold_ft  # the parked continuous-FetchPush HTRPO run trained on with algo.hold_goal
#     experiments/tables.sh htrpo_push_cap_ft   # ... with truncated importance weights (CAP=2: algo.max_log_ratio)
#     experiments/tables.sh htrpo_push_hold_2m  # the finished 2M run trained on with algo.hold_goal
#     KL=1e-4 experiments/tables.sh htrpo_push_hold_kl  # ... the hold_goal run from 2,432k with a larger trust region
#     experiments/tables.sh htrpo_push_hold_1m  # fetch_push_htrpo parked at 1M (EPOCHS=63 htrpo_push), on to 2M with
#         hold_goal and max_kl 1e-4 (KL=...)
#     experiments/tables.sh hpg_push        # HPG on continuous FetchPush as the authors' published config trains it, seed 0 to 512k
#     experiments/tables.sh htrpo_ablations # HTRPO without QKL / goal filtering / weighted IS / sparse reward / hindsight, 8 bits
#     DRY_RUN=1 experiments/tables.sh <table>  # print the her_mpi.sweep commands a table would run, run none
#     experiments/tables.sh htrpo_bits      # HTRPO on 16 and 32 bits from all-zero bits, seeds 0-2
#     experiments/tables.sh htrpo_bits32    # HTRPO 32 bits with 100 filtered hindsight goals, seeds 1-3
#     EPOCHS=20 experiments/tables.sh htrpo_push  # the long tables capped at 20 epochs per run (resume later uncapped)
#     experiments/tables.sh htrpo_reach_fast  # HTRPO FetchReachDiscrete, the minutes recipe, 5 seeds it was not tuned on
#     experiments/tables.sh htrpo_reach_entropy  # FetchReachDiscrete paper recipe with/without the authors' entropy bonus, held-out seeds
#     experiments/tables.sh bitflip_dqn     # Double DQN + HER on 30, 40 and 50 bits, the recipes' budgets
#     experiments/tables.sh predator_prey   # PPO-HER vs PPO on the 12 predator-prey conditions, 2 seeds
#     experiments/tables.sh predator_prey_sac  # SAC+HER vs SAC on the same conditions (~16-22 min per run at np=2, quiet)
#     experiments/tables.sh predator_prey_shift  # PPO-HER with hindsight copies that keep the prey's motion: screen (seeds 0-1), then its recipe on seeds 2-3
#     experiments/tables.sh predator_prey_shift_clip  # ... with those goals clipped to the arena: screen, seeds 0-1
#     experiments/tables.sh predator_prey_static  # PPO-HER and PPO with a static prey (2-D, arena 10), 2 seeds: the early-peak control
#     CONDITIONS="D3_S10_R1.0" experiments/tables.sh predator_prey_sac  # ... on some conditions only
#     RECIPES=predator_prey_sac_her SEEDS=0 experiments/tables.sh predator_prey_sac  # ... one recipe, one seed
#     SEEDS="3" experiments/tables.sh push_updates   # DDPG+KFAC on Push at 400k: the baselines schedule vs twice the updates
#     experiments/tables.sh robotics_updates  # DDPG+KFAC with twice the updates on PickAndPlace, Slide (600k), HandReach (500k)
#     RECIPES=hand_reach_ddpg_kfac SEEDS="1 2" experiments/tables.sh robotics_updates  # ... one task, more seeds
#     SEEDS="3 4" experiments/tables.sh slide_best  # fetch_slide_best (TD3) to 1M env steps, seeds 0-4 by default (~91 min each)
#     experiments/tables.sh slide_updates   # ... with twice the updates per cycle (n_batches 80), seed 0 to 1M
#     experiments/tables.sh pick_and_place_clip  # fetch_pick_and_place_best with inputs clipped at 10 std instead of 5, seed 0 to 600k
#     experiments/tables.sh push_ranks      # the Push recipe (n_batches 80) at np 1, 2, 4, 8, 3 seeds each, 400k: how -np changes learning
#     SEEDS=0,1 RANKS=1 PARALLEL=2 experiments/tables.sh push_ranks  # ... np 1 on two seeds at once, one core each
#     experiments/tables.sh push_ranks_scheduled  # ... at np 8 with train.schedule_ranks=2 (the 2-rank updates per env step), 3 seeds
#     experiments/tables.sh push_ranks_cycle_targets  # ... np 8 scheduled, targets once per 320-update cycle, seed 0
#     EPOCHS=20 experiments/tables.sh htrpo_slide  # HTRPO FetchSlideDiscrete and continuous FetchSlide, the authors' configs, 2M steps
#     experiments/tables.sh htrpo_push_levers  # HTRPO continuous Push, seed 0 to 320k: one change each towards the authors' code
#     EPOCHS=11 experiments/tables.sh htrpo_push_authors  # ... every change at once
#
# Seeds go in the outer loop, so every recipe has its first seed before any has its third: a table
# stopped early still compares all its rows. Set SWEEP_TREE to run from a frozen copy of the code
# (git archive HEAD | tar -x -C DIR) while you keep editing this checkout.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TREE="${SWEEP_TREE:-$ROOT}"
OUT="${SWEEP_OUT:-$ROOT/runs/sweeps}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# EPOCHS=N caps the long tables at N epochs per run ("the longest that fits"); running the
# table again with a larger EPOCHS (or none: the recipe's budget) resumes those runs and trains on.
cap=(); if [ -n "${EPOCHS:-}" ]; then cap=(--set "train.n_epochs=$EPOCHS"); fi

sweep() {  # sweep TABLE ARGS...: one her_mpi.sweep into OUT/TABLE
    local table=$1; shift
    local runner=(python -m her_mpi.sweep --np "${NP:-2}" --parallel "${PARALLEL:-1}" --out "$OUT/$table" "$@")
    if [ -n "${DRY_RUN:-}" ]; then printf '%q ' "${runner[@]}"; echo; return; fi
    (cd "$TREE" && PYTHONPATH="$TREE:$TREE/export" "${runner[@]}")
}

push_fine_tune() {  # push_fine_tune TABLE SEED SETS...: the parked fetch_push_htrpo run of SEED in table SOURCE (default
    # htrpo_push; as parked when TABLE first runs: seed 0 at 752k for htrpo_push_hold_ft and htrpo_push_cap_ft, at 2M
    # since) resumed with SETS to EPOCHS. FROM_EPOCH=N: the parked run must stop at epoch N, the branch point
    local table=$1 seed=$2; shift 2
    local run="$OUT/$table/fetch_push_htrpo/seed$seed" from="${SOURCE:-htrpo_push}"
    local source="$ROOT/experiments/parked/$from/fetch_push_htrpo/seed$seed"
    if [ -n "${DRY_RUN:-}" ]; then echo "resume $run $*"; return; fi
    if [ ! -f "$run/checkpoints/latest.pt" ]; then
        local epochs; epochs=$(python "$ROOT/experiments/park_runs.py" epochs "$source")
        if [ ! -f "$source/checkpoints/latest.pt" ] || { [ -n "${FROM_EPOCH:-}" ] && [ "$epochs" != "$FROM_EPOCH" ]; }; then
            echo "$table seed $seed branches from $source${FROM_EPOCH:+ at epoch $FROM_EPOCH}, which is at epoch $epochs:" \
                 "park $from seed $seed there first (EPOCHS=${FROM_EPOCH:-N} experiments/tables.sh $from)" >&2
            return 2
        fi
        mkdir -p "$run" && cp -r "$source/." "$run/"
        rm -f "$run/finished.json" "$run/sweep.json"  # not the recipe as swept: its label comes from config.yaml
    fi
    # -np 2, not NP: the parked runs' rank count (their rollouts and RNG streams are per rank)
    (cd "$TREE" && PYTHONPATH="$TREE:$TREE/export" mpirun -np 2 python -m her_mpi.train --resume "$run" \
        "$@" --set "train.n_epochs=${EPOCHS:-56}") || return
    # her_mpi.train exits 0 only at its n_epochs: record the clean close, as her_mpi.sweep's finished.json does
    cp "$run/status.json" "$run/finished.json"
}

condition_sweeps() {  # condition_sweeps TABLE ARGS...: the 12 predator-prey conditions (or CONDITIONS), SEEDS
    local table=$1; shift
    for seed in ${SEEDS:-0 1}; do
        for radius in 1.0 0.5; do for size in 10 20; do for dims in 2 3 4; do
            # CONDITIONS (space-separated D{dims}_S{size}_R{radius} names, default all) picks a subset
            case " ${CONDITIONS:-D${dims}_S${size}_R${radius}} " in *" D${dims}_S${size}_R${radius} "*) ;; *) continue ;; esac
            sweep "$table/D${dims}_S${size}_R${radius}" "$@" --seeds "$seed" \
                --set "env.kwargs={dims: $dims, arena_size: $size.0, interception_distance: $radius, prey_mode: random_direction}"
        done; done; done
    done
}

# The FetchPush screening tables (push_ablation, push_levers, push_mrl*) and push_td3_diag ran TD3 with its
# default policy delay 2, before fetch_push_td3 moved to an actor step on every update (delay 1)
TD3_DELAY2=(--set algo.policy_delay=2)

# mrl's best Fetch settings that the package has, FetchPush 300k: batch 2000 across the 2 ranks, 0.125
# updates per env step (2.5x the samples replayed per env step of the baselines schedule at np=2),
# futureactual 2_2, 20% random actions, noise 0.1, action L2 0.01
MRL_SETTINGS=(--set algo.policy_delay=2 --set train.n_epochs=30 --set train.batch_size=1000 --set train.n_batches=25 --set replay.replay_k=2
              --set replay.actual_k=2 --set algo.random_eps=0.2 --set algo.noise_eps=0.1 --set algo.action_l2=0.01)

case "${1:-}" in
push)  # the FetchPush rows at 300k env steps (30 epochs of 10k at np=2); its five recipes seed by
    # seed, so a table stopped early compares them all; the td3_fast lever recipe after them
    for seed in 0 1 2; do
        sweep push --config fetch_push_td3 --config fetch_push_sac --config fetch_push_td3_kfac \
            --config fetch_push_ddpg_kfac --config fetch_push_ddpg --seeds "$seed" --set train.n_epochs=30
    done
    sweep push --config fetch_push_td3_fast --seeds 0-2 --set train.n_epochs=30 ;;
push_ablation)  # each of td3_fast's levers alone on TD3 (td3 and td3_fast themselves: push)
    for seed in 0 1 2 3 4; do
        sweep push_ablation/nstep3 --config fetch_push_td3 "${TD3_DELAY2[@]}" --seeds "$seed" --set train.n_epochs=30 --set algo.n_step=3
        sweep push_ablation/futureactual22 --config fetch_push_td3 "${TD3_DELAY2[@]}" --seeds "$seed" --set train.n_epochs=30 \
            --set replay.replay_k=2 --set replay.actual_k=2
    done ;;
push_levers)  # energy-based episode prioritization; twice the samples replayed per env step, as
    # twice the updates (n_batches 80: 0.4 updates per env step at np=2, baselines' rate at np=1) or as batch 512
    for seed in 0 1 2; do
        sweep push_levers/updates80 --config fetch_push_td3 "${TD3_DELAY2[@]}" --seeds "$seed" --set train.n_epochs=30 \
            --set train.n_batches=80
        sweep push_levers/energy --config fetch_push_td3 "${TD3_DELAY2[@]}" --seeds "$seed" --set train.n_epochs=30 \
            --set replay.episode_priority=energy
        sweep push_levers/batch512 --config fetch_push_td3 "${TD3_DELAY2[@]}" --seeds "$seed" --set train.n_epochs=30 \
            --set train.batch_size=512
    done ;;
push_mrl)  # TD3 with the settings of mrl's best Fetch config that the package has
    for seed in 0 1 2; do
        sweep push_levers/mrl_like --config fetch_push_td3 --seeds "$seed" "${MRL_SETTINGS[@]}"
    done ;;
push_mrl_full)  # push_mrl plus mrl's LayerNorm networks and 10k steps of random warm-up actions
    for seed in 0 1 2; do
        sweep push_levers/mrl_full --config fetch_push_td3 --seeds "$seed" "${MRL_SETTINGS[@]}" \
            --set algo.layer_norm=true --set train.random_steps=10000
    done ;;
push_td3_diag)  # TD3 = DDPG + twin critics + actor every 2nd update + target smoothing + targets moved
    # every 2 updates at polyak 0.99 (DDPG: once per 40-update cycle at 0.95, 4x slower). Undo one at a time; seed
    # 1 first, where DDPG reaches 0.80 at 300k and TD3 0.08. VARIANTS="delay1 ..." runs only those;
    # SEEDS="2 0" picks seeds; EPOCHS=60 trains those runs on to 600k (they resume from their checkpoints)
    declare -A undo=([delay1]="algo.policy_delay=1" [slow_targets]="algo.policy_delay=2 algo.target_update_every=0 algo.polyak=0.95"
                     [one_critic]="algo.policy_delay=2 algo.n_critics=1" [no_smoothing]="algo.policy_delay=2 algo.target_noise=0")
    for variant in ${VARIANTS:-}; do  # a misspelt variant is an error before any run starts
        [ -n "${undo[$variant]+set}" ] || { echo "experiments/tables.sh: VARIANTS has '$variant', expected some of: ${!undo[*]}" >&2; exit 2; }
    done
    for seed in ${SEEDS:-1 2 0}; do
        for variant in ${VARIANTS:-delay1 slow_targets one_critic no_smoothing}; do
            sets=(); for kv in ${undo[$variant]}; do sets+=(--set "$kv"); done
            sweep "push_td3_diag/$variant" --config fetch_push_td3 --seeds "$seed" --set "train.n_epochs=${EPOCHS:-30}" "${sets[@]}"
        done
    done ;;
push_sac_diag)  # which of SAC's two Push fixes matters; the entropy bonus after the target clip
    # is code, the 30% random actions a setting: SAC without them, seeds 0 and 2 (0.98, 0.86)
    for seed in 0 2; do
        sweep push_sac_diag/no_random --config fetch_push_sac --seeds "$seed" --set train.n_epochs=30 --set algo.random_eps=0
    done ;;
other_tasks)  # the best Push recipe on the other robotics tasks, 2 seeds. HandReach gets its own:
    # TD3 stayed at 0.00 there over 500k where the baselines DDPG recipe learns (experiments/results/hand_reach_ddpg.md)
    recipe="${RECIPE:-td3}" hand_recipe="${HAND_RECIPE:-ddpg}"
    for seed in 0 1; do
        sweep other_tasks --config "fetch_pick_and_place_$recipe" --seeds "$seed" --set train.n_epochs=60
        sweep other_tasks --config "fetch_slide_$recipe" --seeds "$seed" --set train.n_epochs=60
        sweep other_tasks --config "hand_reach_$hand_recipe" --seeds "$seed" --set train.n_epochs=50
    done ;;
htrpo_discrete)  # HTRPO on the discrete Fetch tasks (the recipes' own budgets)
    for seed in 0 1 2; do
        sweep htrpo_discrete --config fetch_reach_discrete_htrpo --seeds "$seed" "${cap[@]}"
        sweep htrpo_push_discrete --config fetch_push_discrete_htrpo --seeds "$seed" "${cap[@]}"
    done ;;
htrpo_reach_discrete)  # HTRPO FetchReachDiscrete alone, the paper's recipe (critic-free, as the authors' config)
    for seed in 0 1 2; do
        sweep htrpo_reach_discrete --config fetch_reach_discrete_htrpo --seeds "$seed" "${cap[@]}"
    done ;;
htrpo_reach_entropy)  # the authors' commented-out entropy bonus (0.003, uniform) on FetchReachDiscrete, 40 epochs:
    # entropy seed 1, then both settings on seeds 3-5 (seeds 0 and 2 of both ran before: experiments/results/htrpo_reach_discrete*)
    for seed in ${SEEDS:-1 3 4 5}; do
        [ "$seed" = 1 ] || sweep htrpo_reach_discrete --config fetch_reach_discrete_htrpo --seeds "$seed" --set train.n_epochs=40
        sweep htrpo_reach_discrete_entropy --config fetch_reach_discrete_htrpo --seeds "$seed" \
            --set algo.entropy_coef=0.003 --set algo.entropy_weighting=uniform --set train.n_epochs=40
    done ;;
htrpo_push_discrete)  # HTRPO FetchPushDiscrete alone (2M steps: longer than a session here, see experiments/park_runs.py)
    for seed in 0 1 2; do
        sweep htrpo_push_discrete --config fetch_push_discrete_htrpo --seeds "$seed" "${cap[@]}"
    done ;;
htrpo_push_discrete_critic_batch)  # ... with the value fit on CRITIC_BATCH rows per step (default 8192) instead of
    # every row: a screen of the speed lever experiments/critic_batch.py measured, against the recipe's seeds 0-1
    for seed in ${SEEDS:-0}; do
        sweep "htrpo_push_discrete_critic_batch/rows${CRITIC_BATCH:-8192}" --config fetch_push_discrete_htrpo \
            --seeds "$seed" --set "algo.critic_batch_size=${CRITIC_BATCH:-8192}" "${cap[@]}"
    done ;;
htrpo_push)  # HTRPO on continuous FetchPush (2M steps: ~hours per seed here; stop and resume at will)
    for seed in 0 1 2; do
        sweep htrpo_push --config fetch_push_htrpo --seeds "$seed" "${cap[@]}"
    done ;;
ms_pacman)  # HTRPO and DQN+HER on MsPacmanGoal-v0, the recipes' 2M-step budgets
    for seed in 0 1 2; do
        sweep ms_pacman --config ms_pacman_goal_htrpo --config ms_pacman_goal_dqn --seeds "$seed" "${cap[@]}"
    done ;;
ms_pacman_htrpo_levers)  # levers on ms_pacman_goal_htrpo (0.506 / 0.302 exact on seeds 0 / 1, paper 64%),
    # screened on seed 0 to 500k steps (the recipe there: 0.30): twice the episodes per iteration (a less noisy
    # natural gradient), twice the trust region, twice the hindsight goals. Then the authors' code where it differs:
    # the raw goal cell (they normalise no input of this env) and tanh layers (authors_inputs); weighted IS over the
    # copies still running (running_is); both with their critic-free, own-goal-free, bonus-free settings (authors_all), and
    # authors_all with the recipe's entropy bonus kept (authors_bonus: authors_all's entropy falls to 0.07 by 700k and
    # its success plateaus; the bonus did not change that on seed 0); authors_bonus10: ten times that bonus (0.03;
    # experiments/entropy_gradient.py: 0.003 is <= 1 % of the step; at 500k it helps seed 2, slows seed 0; to 2M it passes the
    # bonus-free plateaus: now the recipe ms_pacman_goal_htrpo_authors). LEVERS picks some; SEEDS others
    authors_inputs="normalizer.enabled=false algo.activation=tanh"
    authors_path="$authors_inputs algo.is_normaliser=running algo.critic=false algo.original_goals=false"
    declare -A lever=([batch2x]="train.rollouts_per_rank=12 train.n_cycles=50" [kl2x]="algo.max_kl=4.0e-5" [goals32]="algo.n_goals=32"
        [authors_inputs]="$authors_inputs" [running_is]="algo.is_normaliser=running"
        [authors_all]="$authors_path algo.entropy_coef=0 algo.entropy_weighting=surrogate" [authors_bonus]="$authors_path"
        [authors_bonus10]="$authors_path algo.entropy_coef=0.03")
    for name in ${LEVERS:-batch2x kl2x goals32}; do  # a misspelt lever is an error before any run starts
        [ -n "${lever[$name]+set}" ] || { echo "experiments/tables.sh: LEVERS has '$name', expected some of: ${!lever[*]}" >&2; exit 2; }
    done
    for seed in ${SEEDS:-0}; do for name in ${LEVERS:-batch2x kl2x goals32}; do
        sets=(); for kv in ${lever[$name]}; do sets+=(--set "$kv"); done  # batch2x: epochs of the same length
        sweep "ms_pacman_htrpo_levers/$name" --config ms_pacman_goal_htrpo --seeds "$seed" "${sets[@]}" \
            --set "train.max_env_steps=${MAX_STEPS:-500000}"
    done; done ;;
hpg_screen)  # HPG (plain gradient step on HTRPO's hindsight objective) on 8 bits, seed 0, 30 epochs of
    # ~2.5k steps: Adam step size x episodes per iteration (one step per iteration, so smaller batches take more);
    # the 8-episode runs were then trained on to 60 epochs (PER_RANK=4 EPOCHS=60)
    for lr in ${LRS-1e-3 3e-3}; do for per_rank in ${PER_RANK:-4 8}; do  # LRS= (empty) skips to the entropy runs
        sweep "hpg_screen/lr${lr}_ep$((2 * per_rank))" --config bitflip_8_htrpo --seeds 0 --set algo=hpg --set algo.n_goals=32 \
            --set algo.gae_lambda=0.95 --set "algo.lr_actor=$lr" --set "train.rollouts_per_rank=$per_rank" \
            --set "train.n_cycles=$((160 / per_rank))" --set "train.n_epochs=${EPOCHS:-30}"
    done; done
    # then an entropy bonus (now in bitflip_8_hpg: 0.03; without it the policy's entropy falls to ~0.4 nats)
    for coef in ${ENTROPY:-0.01 0.03}; do
        sweep "hpg_screen/entropy$coef" --config bitflip_8_hpg --seeds 0 --set "algo.entropy_coef=$coef" \
            --set algo.entropy_weighting=uniform --set "train.n_epochs=${EPOCHS:-30}"
    done ;;
htrpo_vs_hpg)  # the HTRPO paper's baseline comparison on 8 bits (read at equal env steps: --at), seeds 1-3 (both
    # recipes were set on seed 0); HPG without its entropy bonus, and HTRPO with HPG's bonus
    sweep htrpo_vs_hpg --config bitflip_8_htrpo --config bitflip_8_hpg --seeds "${SEEDS:-1-3}" --set train.n_epochs=30
    sweep hpg_no_bonus --config bitflip_8_hpg --seeds "${SEEDS:-1-3}" --set algo.entropy_coef=0 \
        --set algo.entropy_weighting=surrogate --set train.n_epochs=30
    sweep htrpo_bonus --config bitflip_8_htrpo --seeds "${SEEDS:-1-3}" --set algo.entropy_coef=0.03 \
        --set algo.entropy_weighting=uniform --set train.n_epochs=30 ;;
htrpo_reach)  # HTRPO on continuous FetchReach (the paper's Table 1: 100%), fetch_reach_htrpo at its 15 epochs,
    # seeds 1-3 (tuned on seed 0), as it was before it took algo.hold_goal (the runs were made without the --set)
    sweep htrpo_reach --config fetch_reach_htrpo --seeds "${SEEDS:-1-3}" --set algo.hold_goal=false ;;
htrpo_reach_hold)  # ... with copies that run past their first success (algo.hold_goal, now in the recipe): without
    # it the policy reaches every goal and drifts off before the last step, which FetchReach judges. Screened on seed 0
    # (SEEDS=0), then seeds 1-3
    sweep htrpo_reach_hold --config fetch_reach_htrpo --seeds "${SEEDS:-1-3}" --set algo.hold_goal=true "${cap[@]}" ;;
htrpo_push_hold_ft)  # the parked fetch_push_htrpo seed-0 run (752k steps, test 0.01-0.04 per span since 160k, yet its policy
    # reaches the goal with the object in ~half of its episodes and pushes on past it) trained on with algo.hold_goal to
    # EPOCHS (default 56: +144k steps). A diagnostic of hold_goal on Push, not a recipe's curve
    push_fine_tune htrpo_push_hold_ft 0 --set algo.hold_goal=true ;;
htrpo_push_cap_ft)  # the same 752k run trained on with truncated importance weights (algo.max_log_ratio=2: ESS of the
    # hindsight weights 65k instead of 8.8k of 265k rows on one batch, htrpo_log_ratio_clip.md) to EPOCHS
    # (default 56: +144k steps). Does the goal-specific policy learn faster once its hindsight copies weigh again?
    push_fine_tune htrpo_push_cap_ft 0 --set "algo.max_log_ratio=${CAP:-2}" ;;
htrpo_push_hold_2m)  # the finished 2M fetch_push_htrpo seed-0 run (it reaches the goal with the object in 85% of unseen
    # episodes, holds it there at the last step in 10%) trained on with algo.hold_goal to EPOCHS (default 145: +320k
    # steps). Does paying copies for staying at the goal turn reaching into holding? A diagnostic, not a recipe's curve
    EPOCHS=${EPOCHS:-145} push_fine_tune htrpo_push_hold_2m 0 --set algo.hold_goal=true ;;
htrpo_push_hold_kl)  # the hold_goal run parked at 2,432k (htrpo_push_hold_2m: test ~0.35, flat over its last ~100k, each
    # step using the whole trust region with the surrogate gain the gradient predicts) trained on with max_kl KL (default
    # 1e-4, 5x the recipe's) to EPOCHS (default 158: +96k). Is it the trust region's size that holds the policy back?
    SOURCE=htrpo_push_hold_2m EPOCHS=${EPOCHS:-158} push_fine_tune "htrpo_push_hold_kl/${KL:-1e-4}" 0 \
        --set algo.hold_goal=true --set "algo.max_kl=${KL:-1e-4}" ;;
htrpo_push_hold_1m)  # fetch_push_htrpo to 1M steps (first: EPOCHS=63 experiments/tables.sh htrpo_push, park), then on
    # to EPOCHS (default 125: 2M) with algo.hold_goal and max_kl KL (default 1e-4), seeds SEEDS (default 1). From 2M
    # they lifted test 0.10 -> 0.35 -> 0.41 (htrpo_push_hold_2m, _kl); from the start or at 752k hold_goal did nothing,
    # nor did the larger trust region from the start. Does switching at 1M give the row a better 2M?
    for seed in ${SEEDS:-1}; do
        FROM_EPOCH=63 EPOCHS=${EPOCHS:-125} push_fine_tune "htrpo_push_hold_1m/${KL:-1e-4}" "$seed" \
            --set algo.hold_goal=true --set "algo.max_kl=${KL:-1e-4}"
    done ;;
hpg_push)  # the HTRPO authors' published FetchPush config sets using_hpg, so their code trains HPG there
    # (fetch_push_hpg); fetch_push_htrpo (the trust-region reading) was at the untrained level at 900k then. Screen:
    # seed 0 (SEEDS=...) to EPOCHS (default 32 epochs = 512k steps), beside fetch_push_htrpo's curve
    sweep hpg_push --config fetch_push_hpg --seeds "${SEEDS:-0}" --set "train.n_epochs=${EPOCHS:-32}" ;;
htrpo_ablations)  # the HTRPO paper's ablations (its Figure 5) on bitflip_8_htrpo, one switch each, seeds 1-3,
    # 30 epochs; the recipe itself is htrpo_vs_hpg's row
    declare -A switch=([kl_analytic]="algo.kl=analytic" [kl_logratio]="algo.kl=logratio" [no_goal_filtering]="algo.goal_filtering=false"
                       [no_weighted_is]="algo.weighted_is=false" [dense_reward]="algo.reward=dense" [no_hindsight]="algo.hindsight=false")
    for seed in ${SEEDS:-1 2 3}; do for name in kl_analytic kl_logratio no_goal_filtering no_weighted_is dense_reward no_hindsight; do
        sweep "htrpo_ablations/$name" --config bitflip_8_htrpo --seeds "$seed" --set "${switch[$name]}" --set train.n_epochs=30
    done; done ;;
htrpo_bits)  # HTRPO on 16 and 32 bits (bitflip_{16,32}_htrpo), 3 seeds; htrpo_bits32 below is the 32-bit table
    for seed in 0 1 2; do
        sweep htrpo_bits --config bitflip_16_htrpo --config bitflip_32_htrpo --seeds "$seed" "${cap[@]}"
    done ;;
htrpo_bits32)  # bitflip_32_htrpo (100 filtered hindsight goals) on seeds 1-3 (screened on seed 0)
    sweep htrpo_bits32 --config bitflip_32_htrpo --seeds 1-3 "${cap[@]}" ;;
htrpo_reach_fast)  # fetch_reach_discrete_htrpo_fast on seeds 10-14 (tuned on seeds 0-4)
    sweep htrpo_reach_fast --config fetch_reach_discrete_htrpo_fast --seeds 10-14 ;;
bitflip_dqn)  # the HER paper's bit-flipping rows, 3 seeds
    for seed in 0 1 2; do
        sweep bitflip_dqn --config bitflip_30_dqn --config bitflip_40_dqn --config bitflip_50_dqn --seeds "$seed"
    done ;;
predator_prey|predator_prey_sac)  # the PPO-HER paper's 12 conditions, interception distance x arena
    # size x dimensions, equal env steps (the recipes' 256k budget); one sweep directory per condition
    if [ "$1" = predator_prey ]; then names=(predator_prey_ppo_her predator_prey_ppo)
    else names=(predator_prey_sac_her predator_prey_sac); fi
    # RECIPES (space-separated recipe names, default both of the table's) and SEEDS (default "0 1") pick a subset
    recipes=(); for name in ${RECIPES:-${names[*]}}; do recipes+=(--config "$name"); done
    condition_sweeps predator_prey "${recipes[@]}" ;;
predator_prey_shift)  # PPO-HER whose hindsight copies keep the prey's motion (algo.shift_goals): is the
    # decline after its early peak the `final` copies' standing goal? Same conditions and budget; the
    # screen ran seeds 0-1 as an override, then the recipe it became ran on seeds it was not chosen on
    condition_sweeps predator_prey_shift --config predator_prey_ppo_her --set algo.shift_goals=true
    SEEDS="${SEEDS_HELD_OUT:-2 3}" condition_sweeps predator_prey_shift --config predator_prey_ppo_her_shift ;;
predator_prey_shift_clip)  # the shifted copies' goals clipped to the arena as the env clips its prey
    # (a translated trajectory can leave it): a screen on seeds 0-1 against predator_prey_shift's
    condition_sweeps predator_prey_shift_clip --config predator_prey_ppo_her_shift --set algo.clip_shifted_goals=true ;;
predator_prey_static)  # control for PPO-HER's early peak on a moving prey: the same 2-D arena-10 condition
    # with a prey that stands still, where the `final` hindsight copies match what the agent sees
    sweep predator_prey_static/D2_S10_R1.0 --config predator_prey_ppo_her --config predator_prey_ppo --seeds 0-1 \
        --set "env.kwargs={dims: 2, arena_size: 10.0, interception_distance: 1.0, prey_mode: static}" ;;
push_updates)  # DDPG+KFAC on FetchPush: twice the baselines' replayed samples per env step (n_batches 80) against the recipe
    for seed in ${SEEDS:-3}; do
        sweep push_screen_nb80 --config fetch_push_ddpg_kfac --seeds "$seed" --set train.n_batches=80 \
            --set train.max_env_steps=400000 --set train.n_epochs=40
        sweep push_screen_base --config fetch_push_ddpg_kfac --seeds "$seed" --set train.max_env_steps=400000 \
            --set train.n_epochs=40
    done ;;
robotics_updates)  # DDPG+KFAC with n_batches 80 on the other robotics tasks; RECIPES picks some (default all three)
    declare -A budget=([fetch_pick_and_place_ddpg_kfac]=600000 [fetch_slide_ddpg_kfac]=600000 [hand_reach_ddpg_kfac]=500000)
    recipes="${RECIPES:-fetch_pick_and_place_ddpg_kfac fetch_slide_ddpg_kfac hand_reach_ddpg_kfac}"
    for name in $recipes; do
        [ -n "${budget[$name]+set}" ] || { echo "experiments/tables.sh: RECIPES has '$name', expected some of: ${!budget[*]}" >&2; exit 2; }
    done
    for seed in ${SEEDS:-0}; do
        for recipe in $recipes; do
            sweep robotics_nb80 --config "$recipe" --seeds "$seed" --set train.n_batches=80 \
                --set train.max_env_steps=${budget[$recipe]} --set train.n_epochs=$((budget[$recipe] / 10000))
        done
    done ;;
slide_best)  # the recommended FetchSlide recipe (TD3) at the 1M env steps the robotics table's target names, seeds 0-4
    for seed in ${SEEDS:-0 1 2 3 4}; do
        sweep slide_best --config fetch_slide_best --seeds "$seed" --set train.max_env_steps=1000000 --set train.n_epochs=100
    done ;;
slide_updates)  # fetch_slide_best (TD3) with twice the updates per cycle (n_batches 80), the one lever within the table's
    # budget not yet tried with TD3 on Slide, whose policy plateaus at ~0.75 misjudging the range; seed 0 to 1M (~2.5 h)
    for seed in ${SEEDS:-0}; do
        sweep slide_updates --config fetch_slide_best --seeds "$seed" --set train.n_batches=80 \
            --set train.max_env_steps=1000000 --set train.n_epochs=100
    done ;;
pick_and_place_clip)  # fetch_pick_and_place_best with normalised inputs clipped at 10 std instead of 5: its policy fails
    # every goal more than 0.3 m above the table, where the object's height lies beyond 5 of its std (object_contact.py)
    for seed in ${SEEDS:-0}; do
        sweep pick_and_place_clip --config fetch_pick_and_place_best --seeds "$seed" --set normalizer.clip=10
    done ;;
push_ranks)  # the Push recipe with twice the updates at 1, 2, 4 and 8 ranks, the same env-step budget and ~10k
    # steps per epoch (n_cycles 100/np: 9.6k at np 8; ranks beyond the cores are slower, not different); seeds outermost
    for seed in ${SEEDS:-0 1 2}; do
        for np in ${RANKS:-1 2 4 8}; do
            NP=$np sweep "push_ranks/np$np" --config fetch_push_ddpg_kfac --seeds "$seed" --set train.n_batches=80 \
                --set train.n_cycles=$((100 / np)) --set train.max_env_steps=400000 --set train.n_epochs=400
        done
    done ;;
push_ranks_scheduled|push_ranks_cycle_targets)  # ... at 8 ranks keeping the 2-rank schedule: 320 updates of 64 per
    # cycle instead of 80 of 256; push_ranks_cycle_targets moves DDPG's targets once per 320-update cycle, as schedule_ranks
    # did before it moved them once per n_batches (80) updates: four times fewer target moves per update than at np 2
    out=push_ranks/np8_schedule2 default_seeds="0 1 2" targets=()
    if [ "$1" = push_ranks_cycle_targets ]; then
        out=push_ranks_cycle_targets/np8_schedule2 default_seeds=0 targets=(--set algo.target_update_every=320)
    fi
    for seed in ${SEEDS:-$default_seeds}; do
        NP=8 sweep "$out" --config fetch_push_ddpg_kfac --seeds "$seed" --set train.n_batches=80 \
            --set train.schedule_ranks=2 "${targets[@]}" --set train.n_cycles=12 --set train.max_env_steps=400000 \
            --set train.n_epochs=400
    done ;;
htrpo_push_authors)  # HTRPO continuous FetchPush, seed 0 (EPOCHS=N stops at N of 125), every difference from the
    # authors' code at once (their newest HTRPO Fetch configs: no entropy term); if it learns, htrpo_push_levers bisects
    sweep htrpo_push_authors --config fetch_push_htrpo --seeds "${SEEDS:-0}" --set algo.init=orthogonal \
        --set algo.goal_decimals=2 --set algo.goal_filtering_scale=raw --set algo.is_normaliser=running \
        --set algo.hvp_subsample=1.0 --set algo.line_search_accept_ratio=0.1 --set algo.adopt_first_statistics=true \
        --set algo.entropy_coef=0 --set algo.entropy_weighting=surrogate --set algo.bootstrap_time_limit=false \
        "${cap[@]}" ;;
htrpo_slide)  # HTRPO on FetchSlideDiscrete and continuous FetchSlide (2M steps each: hours per run; stop and resume at will)
    for seed in ${SEEDS:-0}; do
        sweep htrpo_slide --config fetch_slide_discrete_htrpo --seeds "$seed" "${cap[@]}"
        sweep htrpo_slide --config fetch_slide_htrpo --seeds "$seed" "${cap[@]}"
    done ;;
htrpo_push_levers)  # HTRPO continuous FetchPush, seed 0 to 320k (20 epochs; EPOCHS=N stops at N), one difference from
    # the authors' code each (LEVERS picks some); the recipe's own first 320k is htrpo_push's seed 0. Early signals:
    # train success (the recipe's falls from ~0.06 to ~0.02 by 176k), copies_reached, ess, object contact. LEVERS may
    # name changes of our own too, e.g. algo.gae_lambda=0.95 (the authors' GAE_lambda is 0, as the recipe's); '+' joins
    # changes made together, e.g. the authors' normalizer: algo.statistics=lagged+algo.statistics_rows=hindsight
    for lever in ${LEVERS:-algo.init=orthogonal algo.hvp_subsample=1.0 algo.is_normaliser=running algo.goal_decimals=2 \
                 algo.hold_goal=true}; do
        sets=(); IFS=+ read -ra changes <<< "$lever"; for kv in "${changes[@]}"; do sets+=(--set "$kv"); done
        sweep "htrpo_push_levers/${lever//[.=+]/_}" --config fetch_push_htrpo --seeds "${SEEDS:-0}" "${sets[@]}" \
            --set "train.n_epochs=${EPOCHS:-20}"
    done ;;
*)
    echo "usage: experiments/tables.sh push|push_ablation|push_levers|push_mrl|push_mrl_full|push_td3_diag|push_sac_diag|other_tasks|htrpo_discrete|htrpo_reach_discrete|htrpo_reach_entropy|htrpo_push_discrete|htrpo_push_discrete_critic_batch|htrpo_push|ms_pacman|ms_pacman_htrpo_levers|hpg_screen|htrpo_vs_hpg|htrpo_ablations|htrpo_reach|htrpo_reach_hold|htrpo_reach_fast|htrpo_bits|htrpo_bits32|bitflip_dqn|predator_prey|predator_prey_sac|predator_prey_shift|predator_prey_shift_clip|predator_prey_static|push_updates|robotics_updates|slide_best|slide_updates|pick_and_place_clip|push_ranks|push_ranks_scheduled|push_ranks_cycle_targets|htrpo_push_levers|htrpo_push_authors|htrpo_slide|htrpo_push_hold_ft|htrpo_push_cap_ft|htrpo_push_hold_2m|htrpo_push_hold_kl|htrpo_push_hold_1m|hpg_push" >&2
    exit 2 ;;
esac
